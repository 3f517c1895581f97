"""A running local troupe cluster as a test sees it, and fault schedules for chaos soaks.

:class:`Cluster` is what the ``troupe_cluster`` fixture (:mod:`troupe.runtime.testing.plugin`) returns:
the node process, its endpoints, and async calls for its status, faults, clients and, when the
node runs a master, jobs.
"""

from __future__ import annotations

import inspect
import os
import random
import subprocess
import time
import tomllib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psutil

from troupe.runtime.core.client import connect
from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.errors import AskTimeout
from troupe.runtime.tasks.master.controls import MAX_WAIT_JOB_S

__all__ = ["ChaosEvent", "Cluster", "random_schedule"]


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
        master_endpoint: the master's endpoint, when the node runs one (``master=True``).
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        endpoint: str,
        name: str,
        log_dir: Path,
        master_endpoint: str | None = None,
    ) -> None:
        self.proc = proc
        self.endpoint = endpoint
        self.name = name
        self.log_dir = log_dir
        self.master_endpoint = master_endpoint

    def descendants(self) -> list[psutil.Process]:
        """Every process the node started (workers, supervisor), alive now."""
        try:
            children: list[psutil.Process] = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return children

    def exited(self) -> str | None:
        """How the node's process ended (``troupe node 't' exited (-9)``), None while it runs."""
        code = self.proc.poll()
        return None if code is None else f"troupe node {self.name!r} exited ({code}); see {self.log_dir}"

    async def control(self, msg_type: str, payload: Any = None, timeout: float = 5.0) -> Any:
        """Send one control message to the node and return its reply."""
        async with process_runtime("test", f"test-{os.getpid()}", drain_timeout=0.1) as rt:
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
            TimeoutError: it did not hold within ``timeout`` seconds; the message names the
                predicate and shows each worker as the last reply had it (a bare TimeoutError
                left a failing test to guess what it waited for).
            RuntimeError: the node's process exited; the message gives its exit status.
        """
        last: dict[str, Any] | None = None
        with anyio.move_on_after(timeout):
            while True:
                if self.proc.poll() is not None:  # no answer will come: say why, at once
                    raise RuntimeError(_not_held(predicate, timeout, last, self.exited()))
                try:
                    last = await self.supervision(timeout=1.0)
                except AskTimeout:
                    continue  # the node may be busy for a moment; the outer deadline bounds this
                if predicate(last):
                    return last
                await anyio.sleep(poll_s)
        raise TimeoutError(_not_held(predicate, timeout, last, self.exited()))

    async def master_control(self, msg_type: str, payload: Any = None, timeout: float = 10.0) -> Any:
        """Send one control message to the cluster's master and return its reply.

        Raises:
            RuntimeError: the cluster was started without ``master=True``.
        """
        if self.master_endpoint is None:
            raise RuntimeError(
                f"cluster {self.name!r} runs no master; start it with troupe_cluster(..., master=True)"
            )
        async with process_runtime("test", f"test-{os.getpid()}", drain_timeout=0.1) as rt:
            return await rt.control(self.master_endpoint, msg_type, payload, timeout=timeout)

    async def submit(self, job: str | Mapping[str, Any], job_id: str | None = None) -> str:
        """Submit a job to the cluster's master; return its id.

        Args:
            job: the job file's text (TOML, as ``troupe ctl submit`` takes) or its parsed map.
            job_id: the job's id (default: the job's name).
        """
        data = tomllib.loads(job) if isinstance(job, str) else dict(job)
        reply = await self.master_control("submit", {"job": data, "source": "<test job>", "job_id": job_id})
        return str(reply["job_id"])

    async def wait_job(self, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until every task of the job is final; return the job (state, counts by state).

        Raises:
            TimeoutError: the job was still running after ``timeout`` seconds.
        """
        wait_s = min(timeout, MAX_WAIT_JOB_S)  # the master waits a day at most
        job: dict[str, Any] = await self.master_control(
            "wait_job", {"job_id": job_id, "timeout_s": wait_s}, timeout=wait_s + 10.0
        )
        if job["state"] == "running":
            # what the master says the job waits for (no live worker runs its kind...), as
            # ``troupe ctl jobs`` shows it
            waiting = "".join(
                f"; {w.get('tasks')} task(s) {w.get('reason')}"
                for w in job.get("waiting") or ()
                if isinstance(w, dict)
            )
            raise TimeoutError(f"job {job_id!r} still running after {timeout}s: {job['counts']}{waiting}")
        return job

    async def run_job(
        self, job: str | Mapping[str, Any], job_id: str | None = None, timeout: float = 60.0
    ) -> dict[str, Any]:
        """Submit a job and wait for it to finish (see :meth:`submit` and :meth:`wait_job`)."""
        return await self.wait_job(await self.submit(job, job_id), timeout)

    async def dead_letters(self, job_id: str) -> list[dict[str, Any]]:
        """The job's dead-lettered tasks, each with its last error and traceback."""
        letters: list[dict[str, Any]] = await self.master_control("dead", {"job_id": job_id})
        return letters

    async def run_pipeline(self, pipeline: Any, out: Any = None, **options: Any) -> Any:
        """Run a pipeline with this node's workers as its replicas (:func:`run_pipeline` with
        ``node`` set, and ``master`` when the node runs one); return its PipelineResult."""
        from troupe.runtime.pipeline.runner import run_pipeline

        options.setdefault("node", self.endpoint)
        if self.master_endpoint is not None:
            options.setdefault("master", self.master_endpoint)
        return await run_pipeline(pipeline, out, **options)

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


def _not_held(
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float,
    last: dict[str, Any] | None,
    exited: str | None = None,
) -> str:
    """Why ``wait_for`` gave up: the predicate (its source line, where it can be read) and each
    worker as the node last told, or that the node's process exited."""
    try:
        said = inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        said = repr(predicate)
    if exited is not None:
        return f"wait_for: {exited} (waiting for {said})"
    if last is None:
        return f"wait_for: the node never answered within {timeout:g} s (waiting for {said})"
    workers = "; ".join(
        f"{w.get('name')}: {w.get('state')}, restarts {w.get('restarts')}, pid {w.get('pid')}"
        for w in last.get("workers", [])
        if isinstance(w, dict)
    )
    return f"wait_for: still false after {timeout:g} s: {said}; the workers as last told: {workers or 'none'}"
