"""A pytest plugin: real local troupe clusters, and faults injected on demand or by schedule.

Registered as the ``troupe`` pytest11 entry point; a test module can also import the fixture
(``from troupe.runtime.testing.plugin import troupe_cluster``). Example::

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

- An ``async def`` test that uses ``troupe_cluster`` runs on an asyncio event loop of the
  plugin's own: no pytest config and no async plugin are needed. Where pytest-asyncio (or
  anyio's plugin) already runs the test, the plugin leaves it to them.
- The node and its workers get the test's import path (``PYTHONPATH``: the test process's
  ``sys.path``, pytest's rootdir and the test file's folder), so they import the project's own
  actor classes wherever pytest was started from.
- A worker that cannot start (its class does not import, its constructor raises) fails the
  fixture at once with the worker's error, not after the readiness timeout.
- ``troupe_cluster(CONFIG, master=True)`` also runs a master in the node's process, on a new
  journal under ``tmp_path``; ``await cluster.run_job(JOB_TOML)`` submits a job and waits for
  it to finish, to test a ``TaskActor``.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from troupe.runtime.errors import AskTimeout, Unreachable
from troupe.runtime.node.child import PARENT_PID_ENV
from troupe.runtime.transports.loopback import free_endpoint

from .cluster import ChaosEvent, Cluster, random_schedule

__all__ = [
    "ChaosEvent",
    "Cluster",
    "ClusterStartError",
    "free_endpoint",
    "import_path",
    "node_start_command",
    "random_schedule",
    "reap",
    "start_cluster",
    "troupe_cluster",
]


class ClusterStartError(RuntimeError):
    """The node or one of its workers could not start; the message carries its error."""


def node_start_command(config: Path, name: str, endpoint: str, log_dir: Path) -> list[str]:
    """The ``troupe node start`` command line of a test node, run by this interpreter."""
    return [sys.executable, "-m", "troupe.cli.main", "node", "start", "--config", str(config),
            "--name", name, "--endpoint", endpoint, "--logs", str(log_dir)]  # fmt: skip


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


def _ready(status: dict[str, Any]) -> bool:
    return not _not_ready_workers(status)


def _not_ready_workers(status: dict[str, Any]) -> list[str]:
    """Each worker of a node's status that is not running, or not yet watched by its
    supervisor (where supervision is on), said for a failure message."""
    sup = status.get("supervision") or {}
    watched = (sup.get("supervisor") or {}).get("workers", {}) if sup.get("enabled", False) else None
    waiting = []
    for w in status["workers"]:
        if w["state"] != "running":
            waiting.append(f"{w['name']!r} {w['state']} (pid {w.get('pid')}, restarts {w.get('restarts')})")
        elif watched is not None and (watched.get(w["name"]) or {}).get("pid") != w["pid"]:
            waiting.append(f"{w['name']!r} running, not yet watched by the supervisor")
    return waiting


def import_path(*first: str | Path) -> str:
    """A ``PYTHONPATH`` that lets another process import what this one imports.

    ``first`` (say, pytest's rootdir and the test file's folder), then this process's
    ``sys.path`` ("" is the working directory), then the ``PYTHONPATH`` it was given. The
    interpreter's own folders are left out: the child has them anyway.
    """
    own = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    wanted = [str(p) for p in first]
    found = [p or os.getcwd() for p in sys.path]  # "" in sys.path is the working directory
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    out: list[str] = []
    for entry in [*wanted, *found, *inherited]:
        if not os.path.exists(entry):
            continue
        resolved = str(Path(entry).resolve())
        interpreter = any(resolved == o or resolved.startswith(o + os.sep) for o in own)
        if resolved not in out and (entry in wanted or not interpreter):
            out.append(resolved)
    return os.pathsep.join(out)


_CONSOLE_LOG_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")  # the node's console log starts so


def _output_tail(log_dir: Path, name: str, lines: int = 30) -> str:
    try:
        text = (log_dir / f"{name}.out").read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _worker_error(cluster: Cluster, worker: dict[str, Any]) -> str:
    """The worker's own account of why it exited: the node's ``last_error`` where it keeps one,
    else the lines the worker wrote to stderr (which the node's output collects)."""
    if worker.get("last_error"):
        return str(worker["last_error"])
    tail = _output_tail(cluster.log_dir, cluster.name, 200).splitlines()
    said = [line for line in tail if line.startswith(f"worker {worker['name']}:")]
    if said:
        return said[-1]
    starts = [i for i, line in enumerate(tail) if line.startswith("Traceback (most recent call last)")]
    if starts:  # the worker's traceback, up to the node's next log line
        block: list[str] = []
        for line in tail[starts[-1] :]:
            if _CONSOLE_LOG_LINE.match(line):
                break
            block.append(line)
        return "\n".join(block)
    return "\n".join(tail[-30:]) or "(it wrote nothing)"


async def _wait_started(cluster: Cluster, timeout: float) -> None:
    """Poll the node until every worker runs and is watched; fail at once when a worker exits
    before it ever ran, or the node does. Past ``timeout``, the failure names each worker not
    ready and its state (a constructor or ``started()`` that hangs leaves its worker starting)."""
    last: dict[str, Any] | None = None
    with anyio.move_on_after(timeout):
        while True:
            if cluster.proc.poll() is not None:
                raise ClusterStartError(
                    f"troupe node {cluster.name!r} exited ({cluster.proc.returncode}) while starting:\n"
                    f"{_output_tail(cluster.log_dir, cluster.name)}"
                )
            try:
                status = await cluster.supervision(timeout=1.0)
            except (AskTimeout, Unreachable):
                continue  # not listening yet; the outer deadline bounds this
            last = status
            for w in status["workers"]:
                # It exited on its own (an import error, a constructor that raised), or the node
                # gave up restarting it. A kill (say, by a supervisor on a loaded machine) is
                # left to the restart policy, as in production.
                if w["exit"].startswith("exit ") or w["state"] == "failed":
                    raise ClusterStartError(
                        f"worker {w['name']!r} of troupe node {cluster.name!r} could not start "
                        f"({w['exit'] or w['state']}): {_worker_error(cluster, w)}"
                    )
            if _ready(status):
                return
            await anyio.sleep(0.05)
    raise ClusterStartError(_not_ready(cluster, timeout, last))


def _not_ready(cluster: Cluster, timeout: float, last: dict[str, Any] | None) -> str:
    """Why the node was not ready in time: each worker that was not, as the node last told."""
    where = f"see {cluster.log_dir}"
    if last is None:
        return (
            f"troupe node {cluster.name!r} never answered within {timeout:g}s (it was still running); {where}"
        )
    said = "; ".join(_not_ready_workers(last)) or "none (the supervisor was not yet watching them)"
    return (
        f"troupe node {cluster.name!r} not ready within {timeout:g}s; workers not ready: {said} "
        f"(a constructor or started() that does not return leaves its worker starting); {where}"
    )


def start_cluster(
    directory: Path,
    config_text: str,
    name: str = "t",
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    master: bool = False,
) -> Cluster:
    """Start a node process from ``config_text``; return once its workers run and are watched.

    Args:
        directory: where the config, the logs, the journal and the node's output go.
        config_text: a node TOML config (``[node]`` endpoint and name are set here); blank for
            a node with no workers of its own.
        name: the node's name.
        timeout: seconds to wait for readiness.
        env: extra environment for the node and its workers. Its ``PYTHONPATH`` goes first; the
            node always gets :func:`import_path` after it.
        master: also run a master in the node's process (``--with-master``) on a new journal;
            the node's task workers pull from it.

    Raises:
        ClusterStartError: the node or a worker exited while starting, or the node was not
            ready in time; it is reaped first, and the message says why.
    """
    endpoint = free_endpoint()
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / f"{name}.toml"
    # Blank: a node with no workers of its own (a pipeline's replicas are spawned on it).
    config.write_text(config_text if config_text.strip() else "[node]\n")
    log_dir = directory / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    extra = dict(env or {})
    paths = [extra.pop("PYTHONPATH", ""), import_path()]
    command = node_start_command(config, name, endpoint, log_dir)
    master_endpoint = free_endpoint() if master else None
    if master_endpoint is not None:
        command += [
            "--with-master",
            "--master",
            master_endpoint,
            "--journal",
            str(directory / "journal.db"),
            "--new",
        ]
    with open(log_dir / f"{name}.out", "ab") as out:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                **extra,
                "PYTHONPATH": os.pathsep.join(p for p in paths if p),
                PARENT_PID_ENV: str(os.getpid()),  # the node dies with this process (node start)
            },
        )
    cluster = Cluster(proc, endpoint, name, log_dir, master_endpoint)
    try:
        # A thread of its own: the caller may already run an event loop (an async test).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(anyio.run, _wait_started, cluster, timeout).result()
    except BaseException as exc:
        reap(proc, cluster.descendants())
        if isinstance(exc, ClusterStartError):
            raise ClusterStartError(str(exc)) from None
        # (the node's exit status now is the reap's SIGTERM, not why it did not start)
        raise ClusterStartError(
            f"troupe node {name!r} did not start: {type(exc).__name__} while waiting for it; see {log_dir}"
        ) from exc
    return cluster


@pytest.fixture
def troupe_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """A factory ``troupe_cluster(config_text, name="t", timeout=60, env=None, master=False)``.

    Each call starts a real local node (see :func:`start_cluster`) whose processes import what
    the test imports (pytest's rootdir and the test file's folder first).

    Every node started is reaped at teardown with every process it started; a process that
    survives SIGKILL fails the test.
    """
    started: list[Cluster] = []
    test_path = import_path(request.config.rootpath, request.path.parent)

    def factory(
        config_text: str,
        name: str = "t",
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        master: bool = False,
    ) -> Cluster:
        extra = dict(env or {})
        extra["PYTHONPATH"] = os.pathsep.join(p for p in (extra.get("PYTHONPATH", ""), test_path) if p)
        failure = ""
        try:
            cluster = start_cluster(tmp_path / name, config_text, name, timeout, extra, master)
        except ClusterStartError as exc:
            failure = str(exc)
        if failure:  # the cause is the node's or the worker's error, not this plugin's code
            pytest.fail(failure, pytrace=False)
        started.append(cluster)
        return cluster

    yield factory
    leaked: list[int] = []
    for cluster in started:
        leaked += reap(cluster.proc, cluster.descendants())
    if leaked:
        pytest.fail(f"processes survived the cluster teardown: {leaked}")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test that uses ``troupe_cluster`` on an asyncio loop of its own.

    Only where nothing else would run it: pytest-asyncio replaces the coroutine with a plain
    function before this hook sees it, and anyio's plugin runs the tests that have an
    ``anyio_backend``. Everywhere else pytest would fail the test ("async def functions are
    not natively supported").
    """
    test = pyfuncitem.obj
    if not inspect.iscoroutinefunction(test) or "troupe_cluster" not in pyfuncitem.fixturenames:
        return None
    if "anyio_backend" in pyfuncitem.funcargs:
        return None
    args = {arg: pyfuncitem.funcargs[arg] for arg in pyfuncitem._fixtureinfo.argnames}

    async def run() -> None:
        await test(**args)

    anyio.run(run, backend="asyncio")
    return True
