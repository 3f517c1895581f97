"""A pytest plugin: real local troupe clusters, and faults injected on demand or by schedule.

Registered as the ``troupe`` pytest11 entry point; a test module can also import the fixture
(``from troupe.runtime.testing import troupe_cluster``). Example::

    CONFIG = '''
    [supervision]
    interval_s = 0.1
    heartbeat_timeout_s = 0.6

    [[workers]]
    name = "w-render"
    actors = [{ name = "render", class = "mypkg.actors:Renderer" }]
    '''

    async def test_render_survives_a_kill(troupe_cluster):
        cluster = troupe_cluster(CONFIG)
        await cluster.chaos("kill", "w-render")
        await cluster.wait_for(lambda s: cluster.worker_in(s, "w-render")["restarts"] == 1
                               and cluster.worker_in(s, "w-render")["state"] == "running")
        async with cluster.client() as rt:
            assert await rt.ref("render").ask("render", {"frame": 1}) is not None

A cluster is one node process (``troupe node start``) with its supervisor and workers, on a
free loopback port, its logs under the test's ``tmp_path``. The fixture waits (a bounded poll)
until every worker runs and is watched by the supervisor, and at teardown SIGTERMs the node,
waits, SIGKILLs it and every process it started, whatever the test did, and fails the test
if a process survived that.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from .client import connect
from .errors import AskTimeout
from .host import Runtime
from .zmq_transport import ZmqTransport

__all__ = [
    "ChaosEvent",
    "Cluster",
    "free_endpoint",
    "random_schedule",
    "reap",
    "start_cluster",
    "troupe_cluster",
]


def free_endpoint() -> str:
    """A loopback TCP endpoint on a port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def reap(proc: subprocess.Popen[bytes], extra: Sequence[psutil.Process], grace: float = 10.0) -> list[int]:
    """SIGTERM ``proc``, wait ``grace``, SIGKILL; then make sure ``extra`` processes are gone.

    Returns:
        The pids that were still alive after SIGKILL and a further wait (should be none).
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    _, alive = psutil.wait_procs(list(extra), timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _, still = psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in still]


@dataclass(frozen=True)
class ChaosEvent:
    """One fault of a schedule: inject ``kind`` into ``target`` ``at_s`` seconds in.

    ``options`` are the fault's fields (``seconds``, ``probability``, ``count``, ``peers``...).
    ``kind="heal"`` clears the target's faults.
    """

    at_s: float
    kind: str
    target: str
    options: dict[str, Any] = field(default_factory=dict)


def random_schedule(
    kinds: Sequence[str],
    targets: Sequence[str],
    duration_s: float,
    every_s: float,
    seed: int = 0,
    options: dict[str, dict[str, Any]] | None = None,
) -> list[ChaosEvent]:
    """A seeded random fault schedule for a chaos soak: one fault every ``every_s`` seconds.

    Args:
        kinds: the fault kinds to draw from.
        targets: the targets to draw from.
        duration_s: the schedule's length.
        every_s: the spacing of faults.
        seed: makes the schedule replayable.
        options: per kind, the options to give it (e.g. ``{"stall": {"seconds": 5}}``).
    """
    rng = random.Random(seed)
    opts = options or {}
    n = int(duration_s / every_s)
    return [
        ChaosEvent(round((i + 1) * every_s, 6), kind, rng.choice(list(targets)), dict(opts.get(kind, {})))
        for i, kind in enumerate(rng.choice(list(kinds)) for _ in range(n))
    ]


class Cluster:
    """A running local node with its supervisor and workers; every call is async.

    Args:
        proc: the node process.
        endpoint: the node's control endpoint.
        name: the node's name.
        log_dir: where the node's JSON-lines log goes.
    """

    def __init__(self, proc: subprocess.Popen[bytes], endpoint: str, name: str, log_dir: Path) -> None:
        self.proc = proc
        self.endpoint = endpoint
        self.name = name
        self.log_dir = log_dir

    def descendants(self) -> list[psutil.Process]:
        """Every process the node started (workers, supervisor), alive now."""
        try:
            children: list[psutil.Process] = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return children

    async def control(self, msg_type: str, payload: Any = None, timeout: float = 5.0) -> Any:
        """Send one control message to the node and return its reply."""
        async with Runtime("test", f"test-{os.getpid()}", ZmqTransport(), drain_timeout=0.1) as rt:
            return await rt.control(self.endpoint, msg_type, payload, timeout=timeout)

    async def status(self, timeout: float = 5.0) -> dict[str, Any]:
        """The node's full ``status`` reply: workers, their actors' counters, supervision."""
        reply: dict[str, Any] = await self.control("status", None, timeout)
        return reply

    async def supervision(self, timeout: float = 5.0) -> dict[str, Any]:
        """The node's light ``supervision`` reply: workers and supervision, no actor counters.

        It asks no worker, so it stays fast while a worker hangs; :meth:`wait_for` polls it.
        """
        reply: dict[str, Any] = await self.control("supervision", None, timeout)
        return reply

    @staticmethod
    def worker_in(status: dict[str, Any], name: str) -> dict[str, Any]:
        """The entry of worker ``name`` in a status reply."""
        for w in status["workers"]:
            if w["name"] == name:
                return dict(w)
        raise KeyError(f"no worker {name!r} in status; workers: {[w['name'] for w in status['workers']]}")

    async def worker(self, name: str) -> dict[str, Any]:
        """Worker ``name``'s entry now (from the light supervision reply)."""
        return self.worker_in(await self.supervision(), name)

    async def chaos(self, kind: str, target: str, **options: Any) -> dict[str, Any]:
        """Inject a fault now (``kill``) or arm it for the next matching message.

        Args:
            kind: kill, crash, hang_with_gil, stall, slow, drop or partition.
            target: ``WORKER``, ``WORKER/ACTOR``, ``*``, or ``supervisor`` (kill only).
            options: ``seconds``, ``probability``, ``count``, ``after``, ``message_type``,
                ``peers``, ``seed``.
        """
        reply: dict[str, Any] = await self.control("chaos", {"kind": kind, "target": target, **options})
        return reply

    async def heal(self, target: str = "*") -> dict[str, Any]:
        """Clear every fault of ``target``; returns what fired, per worker."""
        reply: dict[str, Any] = await self.control("heal", {"target": target})
        return reply

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0, poll_s: float = 0.02
    ) -> dict[str, Any]:
        """Poll :meth:`supervision` until ``predicate(reply)`` holds; a bounded poll, not a sleep.

        Raises:
            TimeoutError: it did not hold within ``timeout`` seconds.
        """
        with anyio.fail_after(timeout):
            while True:
                try:
                    status = await self.supervision(timeout=1.0)
                except AskTimeout:
                    continue  # the node may be busy for a moment; the outer deadline bounds this
                if predicate(status):
                    return status
                await anyio.sleep(poll_s)

    @asynccontextmanager
    async def client(self, name: str | None = None) -> AsyncIterator[Runtime]:
        """A client runtime whose names resolve through this node."""
        async with connect(self.endpoint, self.name, name) as rt:
            yield rt

    @asynccontextmanager
    async def scheduled(self, events: Iterable[ChaosEvent]) -> AsyncIterator[list[tuple[ChaosEvent, Any]]]:
        """Inject ``events`` at their times (from entering the block) while the block runs.

        Yields:
            A list that fills with ``(event, reply)`` as faults are injected; a fault that the
            node refused (say, its target was restarting) has the error as its reply.
        """
        done: list[tuple[ChaosEvent, Any]] = []

        async def run() -> None:
            t0 = time.monotonic()
            for event in sorted(events, key=lambda e: e.at_s):
                await anyio.sleep(max(0.0, t0 + event.at_s - time.monotonic()))
                try:
                    if event.kind == "heal":
                        reply: Any = await self.heal(event.target)
                    else:
                        reply = await self.chaos(event.kind, event.target, **event.options)
                except Exception as exc:  # the schedule goes on; the test reads what happened
                    reply = exc
                done.append((event, reply))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            yield done
            tg.cancel_scope.cancel()


def _ready(status: dict[str, Any]) -> bool:
    workers = status["workers"]
    if any(w["state"] != "running" for w in workers):
        return False
    sup = status.get("supervision") or {}
    if not sup.get("enabled", False):
        return True
    watched = (sup.get("supervisor") or {}).get("workers", {})
    return all(w["name"] in watched and watched[w["name"]]["pid"] == w["pid"] for w in workers)


def start_cluster(
    directory: Path,
    config_text: str,
    name: str = "t",
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> Cluster:
    """Start a node process from ``config_text``; return once its workers run and are watched.

    Args:
        directory: where the config, the logs and the node's output go.
        config_text: a node TOML config (``[node]`` endpoint and name are set here).
        name: the node's name.
        timeout: seconds to wait for readiness.
        env: extra environment for the node and its workers (e.g. ``PYTHONPATH`` to find
            the test's own actor classes).

    Raises:
        RuntimeError: the node exited early or was not ready in time (it is reaped first).
    """
    endpoint = free_endpoint()
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / f"{name}.toml"
    config.write_text(config_text)
    log_dir = directory / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.out", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "troupe.cli.main", "node", "start", "--config", str(config),
             "--name", name, "--endpoint", endpoint, "--logs", str(log_dir)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    cluster = Cluster(proc, endpoint, name, log_dir)

    async def wait_ready() -> None:
        await cluster.wait_for(_ready, timeout=timeout, poll_s=0.05)

    try:
        # A thread of its own: the caller may already run an event loop (an async fixture).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(anyio.run, wait_ready).result()
    except BaseException as exc:
        reap(proc, cluster.descendants())
        code = proc.returncode
        raise RuntimeError(
            f"troupe node {name!r} not ready within {timeout}s (exit {code}); see {log_dir}"
        ) from exc
    return cluster


@pytest.fixture
def troupe_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """A factory ``troupe_cluster(config_text, name="t", timeout=60, env=None) -> Cluster``.

    Each call starts a real local node (see :func:`start_cluster`).

    Every node started is reaped at teardown with every process it started; a process that
    survives SIGKILL fails the test.
    """
    started: list[Cluster] = []

    def factory(
        config_text: str, name: str = "t", timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> Cluster:
        cluster = start_cluster(tmp_path / name, config_text, name, timeout, env)
        started.append(cluster)
        return cluster

    yield factory
    leaked: list[int] = []
    for cluster in started:
        leaked += reap(cluster.proc, cluster.descendants())
    if leaked:
        pytest.fail(f"processes survived the cluster teardown: {leaked}")
