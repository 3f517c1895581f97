"""The worker's side of task dispatch: pull leases from the master, run them, report back.

A :class:`TaskGetter` speaks for one worker (``node/process``). It registers the worker with
the master, asks for tasks whenever it has a free slot, runs each leased task through its
runner (normally the worker's :class:`~troupe.runtime.tasks.task_actor.TaskActor`), renews the lease
every ``ttl / 3`` while the task runs, and reports ``complete`` (with the result reference) or
``fail`` (with the error text and traceback). Each report carries the next request, so a busy
worker costs the master one message per task. When nothing is pending the master holds the
request (a long poll of up to ``wait_s``) instead of making the worker poll.

A request names the leases the worker holds (``held``: those it runs, and those the previous
request's reply carried). A lease the master sent in reply to an earlier request that is not
among them never arrived: the reply was lost, or came after the worker stopped waiting (its
host's link was cut while the request was held). The master then puts that task back at once,
without an attempt counted, instead of leaving it, and the worker's slot, to the lease's expiry.
After a longer cut the master has declared the node dead and forgotten the worker: it answers
``unknown_worker`` and the getter registers again, under the same name.

The worker advertises the task kinds it runs when it registers (``GetterConfig.kinds``, empty
for every kind), and the master leases it only those. Should a lease of another kind arrive
anyway, the getter does not run it: it declines it (``decline``), and the master puts the
task back without counting an attempt. A runner says the same by raising :class:`KindNotRun`.

A running copy stops when the master says so (``cancel_lease``: another copy won, the job was
cancelled) or when a renewal is refused (the lease ended: expired, requeued after a master
restart); it is then not reported. A master that does not answer is retried; one that forgot
the worker (it restarted) answers ``unknown_worker`` and the getter registers again. A report
that cannot be delivered within ``report_for_s`` is dropped: the output is committed already,
so the copy the master leases again finds it and ends at once.

In a worker process, :func:`start_task_getter` builds the getter from the hosted task actors;
the ``scale`` benchmark runs hundreds of getters with a sleeping runner in one process. In a
worker process a task runs as a message would, for supervision and fault injection: the
worker's status record shows it busy with ``ACTOR/KIND`` (the progress timeout judges it, so
long work must call ``progress()``), and the runtime's before-handle hooks run first with the
task kind as the message type, so an injected fault (``troupe ctl chaos``) reaches task code.
A task that a ``drop`` fault loses is neither run nor reported, like a lost message: its lease
expires at the master, which leases it again.
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import structlog

from troupe.runtime.core.cell import DROP
from troupe.runtime.core.control_payloads import ControlPayload
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import (
    ActorStopped,
    AskTimeout,
    BadFrame,
    TaskError,
    TroupeError,
    UnknownWorker,
    Unreachable,
)

from .task_actor import LeasedTask, TaskActor

__all__ = [
    "GetterConfig",
    "GetterStats",
    "KindNotRun",
    "Runner",
    "TaskGetter",
    "install_task_control",
    "start_task_getter",
]

log = structlog.get_logger(__name__)

Runner = Callable[[LeasedTask], Awaitable[str | None]]
"""Runs one leased task to the end and returns its result reference."""

_TRANSIENT = (AskTimeout, Unreachable, ActorStopped)  # the master is down or restarting


@dataclass(frozen=True, slots=True)
class GetterConfig:
    """How one worker asks for tasks.

    Attributes:
        worker_id: unique in the cluster; ``node/process`` for real workers.
        node_id: the node the worker runs on (locality, drain, node death).
        slots: tasks run at once.
        cpu: CPU cores offered to tasks (default: one per slot).
        gpu: GPUs offered to tasks.
        kinds: task kinds the worker runs; the master leases it only these (empty: every kind).
        wait_s: how long the master may hold a request while nothing is pending.
        call_timeout_s: added to ``wait_s`` before a call to the master counts as lost.
        retry_s: pause after a failed call before trying again.
        report_for_s: how long a complete or fail report is retried before it is dropped.
    """

    worker_id: str
    node_id: str
    slots: int = 1
    cpu: float | None = None
    gpu: int = 0
    kinds: tuple[str, ...] = ()
    wait_s: float = 2.0
    call_timeout_s: float = 5.0
    retry_s: float = 0.5
    report_for_s: float = 60.0

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise TaskError(f"worker {self.worker_id}: slots must be >= 1, got {self.slots}")


@dataclass(frozen=True, slots=True)
class GetterStats:
    """Counters of one getter.

    Attributes:
        running: copies running now.
        started: copies started.
        completed: copies reported complete.
        failed: copies reported failed.
        declined: copies returned unrun, of a kind this worker does not run.
        cancelled: copies stopped by the master or by a refused renewal.
        registrations: times the worker registered (more than one: the master restarted).
        requests: request_task calls made (reports with a piggybacked request not counted).
        lost_reports: reports dropped after ``report_for_s``.
    """

    running: int
    started: int
    completed: int
    failed: int
    declined: int
    cancelled: int
    registrations: int
    requests: int
    lost_reports: int


class _Run:
    """One running copy: its lease and the scope that cancels it."""

    __slots__ = ("cancel_reason", "scope", "task")

    def __init__(self, task: LeasedTask) -> None:
        self.task = task
        self.scope = anyio.CancelScope()
        self.cancel_reason = ""


class TaskGetter:
    """Pulls tasks for one worker from the master and runs them.

    Args:
        runtime: the worker process's runtime (it sends the control messages).
        master: the master's endpoint.
        config: who the worker is and how it asks.
        runner: runs one leased task.
    """

    def __init__(self, runtime: Runtime, master: str, config: GetterConfig, runner: Runner) -> None:
        self.runtime = runtime
        self.master = master
        self.config = config
        self.worker_id = config.worker_id
        self._runner = runner
        self._running: dict[int, _Run] = {}
        self._want = asyncio.Event()
        self._registered = False
        # The leases the last request_task's reply carried, run or not since (reported, or
        # dropped by a fault): the next request names them held, so the master knows they
        # arrived and lets a dropped one expire as before.
        self._received: set[int] = set()
        self._tg: anyio.abc.TaskGroup | None = None
        self._counts = dict.fromkeys(
            (
                "started",
                "completed",
                "failed",
                "declined",
                "cancelled",
                "registrations",
                "requests",
                "lost_reports",
            ),
            0,
        )

    # ------------------------------------------------------------------ life

    async def run(self) -> None:
        """Register, then pull and run tasks until cancelled."""
        structlog.contextvars.bind_contextvars(worker=self.worker_id)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._want.set()
            while True:
                await self._want.wait()
                self._want.clear()
                free = self._free()
                if free <= 0:
                    continue
                if not self._registered:
                    await self._register()
                    continue
                reply = await self._call(
                    "request_task",
                    {
                        "worker_id": self.worker_id,
                        "free_slots": free,
                        "wait_s": self.config.wait_s,
                        # a lease the last request's reply carried that is not here never
                        # arrived: the master puts its task back (see _received)
                        "held": sorted(self._running.keys() | self._received),
                    },
                    self.config.wait_s + self.config.call_timeout_s,
                )
                self._counts["requests"] += 1
                leases = reply.get("leases", ()) if reply is not None else ()
                self._received = {
                    lease["lease_id"]
                    for lease in leases
                    if isinstance(lease, dict) and type(lease.get("lease_id")) is int
                }
                self._start(leases)
                if self._free() > 0:
                    if reply is None or not leases:
                        await anyio.sleep(self.config.retry_s if reply is None else 0.01)
                    self._want.set()

    def cancel(self, lease_id: int, reason: str) -> bool:
        """Stop the running copy under ``lease_id``; return whether one was running."""
        run = self._running.get(lease_id)
        if run is None:
            return False
        run.cancel_reason = reason
        run.scope.cancel()
        return True

    def statistics(self) -> GetterStats:
        """Return a snapshot of the counters."""
        c = self._counts
        return GetterStats(
            len(self._running),
            c["started"],
            c["completed"],
            c["failed"],
            c["declined"],
            c["cancelled"],
            c["registrations"],
            c["requests"],
            c["lost_reports"],
        )

    # ------------------------------------------------------------------ master calls

    def _free(self) -> int:
        return self.config.slots - len(self._running)

    async def _register(self) -> None:
        cfg = self.config
        reply = await self._call(
            "register_worker",
            {
                "worker_id": cfg.worker_id,
                "node": cfg.node_id,
                "endpoint": self.runtime.address,
                "pid": os.getpid(),
                "slots": cfg.slots,
                "cpu": float(cfg.slots if cfg.cpu is None else cfg.cpu),
                "gpu": cfg.gpu,
                "kinds": list(cfg.kinds),
            },
            cfg.call_timeout_s,
        )
        if reply is None:
            await anyio.sleep(cfg.retry_s)
        else:
            self._registered = True
            self._counts["registrations"] += 1
            log.info("worker_registered_with_master", master=self.master, slots=cfg.slots)
        self._want.set()

    async def _call(self, msg_type: str, payload: Any, timeout: float) -> Any:
        """One control call to the master; None when it did not answer or forgot the worker."""
        try:
            return await self.runtime.control(self.master, msg_type, payload, timeout=timeout)
        except UnknownWorker:
            self._registered = False
            self._want.set()
        except _TRANSIENT as exc:
            log.info("master_call_failed", call=msg_type, error=str(exc))
        except TroupeError as exc:  # a refusal or a master bug: never let it kill the worker
            log.warning("master_call_refused", call=msg_type, error=str(exc))
            await anyio.sleep(self.config.retry_s)
        return None

    # ------------------------------------------------------------------ running copies

    def _start(self, leases: Any) -> None:
        assert self._tg is not None
        for raw in leases or ():
            try:
                task = LeasedTask.from_wire(raw)
            except BadFrame as exc:  # the lease will expire on the master and be retried
                log.error("lease_malformed", error=str(exc))
                continue
            run = _Run(task)
            self._running[task.lease_id] = run
            self._counts["started"] += 1
            self._tg.start_soon(self._execute, run)

    async def _execute(self, run: _Run) -> None:
        task = run.task
        structlog.contextvars.bind_contextvars(task_id=task.task_id, lease_id=task.lease_id)
        self.runtime.progress(1, f"task {task.task_id} started")
        report: tuple[str, dict[str, Any]] | None = None
        try:
            with run.scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._renew, run)
                    try:
                        if self.config.kinds and task.kind not in self.config.kinds:
                            raise KindNotRun(
                                f"worker {self.worker_id} runs kinds "
                                f"{list(self.config.kinds)}, not {task.kind!r}"
                            )
                        result = await self._runner(task)
                        report = ("complete", {"result_ref": result or ""})
                    except KindNotRun as exc:  # not an attempt: the master leases it elsewhere
                        report = ("decline", {"reason": str(exc), "kind": task.kind})
                    except _Dropped as exc:  # lost on purpose: no report, the lease expires
                        run.cancel_reason = str(exc)
                    except Exception as exc:
                        report = (
                            "fail",
                            {
                                "error": f"{type(exc).__qualname__}: {exc}",
                                "traceback": "".join(traceback.format_exception(exc)),
                            },
                        )
                    tg.cancel_scope.cancel()
            if report is None:  # cancelled by the master or by a refused renewal
                self._counts["cancelled"] += 1
                log.info("task_cancelled", reason=run.cancel_reason)
                return
            await self._report(run, *report)
        finally:
            self._running.pop(task.lease_id, None)
            self.runtime.progress(1, f"task {task.task_id} ended")
            self._want.set()

    async def _renew(self, run: _Run) -> None:
        task = run.task
        ttl = task.ttl
        payload = {"worker_id": self.worker_id, "task_id": task.task_id, "lease_id": task.lease_id}
        while True:
            await anyio.sleep(max(ttl / 3.0, 0.01))
            try:
                reply = await self.runtime.control(
                    self.master, "renew", payload, timeout=self.config.call_timeout_s
                )
            except TaskError as exc:  # unknown worker included: the lease is gone either way
                reply = {"outcome": "rejected", "reason": str(exc)}
            except TroupeError as exc:  # down, restarting, or a passing fault: try next period
                log.info("renew_failed", error=str(exc))
                continue
            if reply.get("outcome") != "renewed":
                run.cancel_reason = f"renewal refused: {reply.get('reason', reply)}"
                run.scope.cancel()
                return
            ttl = float(reply.get("ttl", ttl))

    async def _report(self, run: _Run, kind: str, fields: dict[str, Any]) -> None:
        task = run.task
        cfg = self.config
        payload = {"worker_id": self.worker_id, "task_id": task.task_id, "lease_id": task.lease_id, **fields}
        deadline = time.monotonic() + cfg.report_for_s
        while True:
            # The slot of this copy is free once the report is in: ask for the next task with it.
            payload["request"] = self._free() + 1 if self._registered else 0
            try:
                reply = await self.runtime.control(self.master, kind, payload, timeout=cfg.call_timeout_s)
                break
            except UnknownWorker:
                self._registered = False
                payload["request"] = 0
            except _TRANSIENT as exc:
                log.info("report_failed", report=kind, error=str(exc))
            except TroupeError as exc:  # refused outright: sending it again changes nothing
                self._counts["lost_reports"] += 1
                log.warning("report_refused", report=kind, error=str(exc))
                return
            if time.monotonic() >= deadline:
                self._counts["lost_reports"] += 1
                log.warning("report_dropped", report=kind, after_s=cfg.report_for_s)
                return
            await anyio.sleep(cfg.retry_s)
        self._counts[{"complete": "completed", "fail": "failed"}.get(kind, "declined")] += 1
        if reply.get("outcome") == "rejected":
            log.warning("report_rejected", report=kind, reason=reply.get("reason"))
        if not reply.get("known", True):
            self._registered = False
        self._running.pop(task.lease_id, None)
        self._start(reply.get("leases", ()))


def install_task_control(runtime: Runtime, getters: Mapping[str, TaskGetter]) -> None:
    """Answer the master's ``cancel_lease`` messages for the getters of this process.

    Args:
        runtime: the process's runtime.
        getters: worker id -> its getter (looked up on every message, so it may grow).
    """

    async def cancel_lease(payload: Any) -> bool:
        p = ControlPayload("cancel_lease", payload)
        worker_id, lease_id = p.require("worker_id", str), p.require("lease_id", int)
        reason = p.optional("reason", str, "")
        getter = getters.get(worker_id)
        if getter is None:
            return False
        return getter.cancel(lease_id, reason)

    runtime.register_control("cancel_lease", cancel_lease)


class KindNotRun(TaskError):
    """A runner does not run the leased task's kind: the copy is declined, not failed."""


class _Dropped(Exception):
    """A before-handle hook (an injected ``drop`` fault) lost this task; never leaves this module."""


class _ActorRunner:
    """Runs a lease on the hosted task actor for its kind, within that actor's slots.

    Around each task it marks the worker busy and runs the before-handle hooks (see the module
    docstring). The status record has one current item: the worker shows idle only once its
    last running task ends (a message ending meanwhile may show it idle early, which delays a
    no-progress kill but never fakes one).
    """

    def __init__(self, actors: list[TaskActor]) -> None:
        self._actors = [(a, anyio.Semaphore(type(a).slots)) for a in actors]
        self._busy = 0

    async def __call__(self, task: LeasedTask) -> str | None:
        able = [(a, s) for a, s in self._actors if type(a).runs(task.kind)]
        if not able:
            kinds = sorted({k for a, _ in self._actors for k in type(a).task_kinds})
            raise KindNotRun(f"no actor in this worker runs task kind {task.kind!r} (it runs {kinds})")
        actor, slots = max(able, key=lambda pair: pair[1].value)
        async with slots:
            runtime: Runtime | None = getattr(actor, "runtime", None)  # None: never spawned
            if runtime is None:
                return await actor.run_task(task)
            name, observer = actor.address.actor, runtime.observer
            # This task's own context: the task's log lines say which actor runs it.
            structlog.contextvars.bind_contextvars(actor=name)
            self._busy += 1
            if observer is not None:
                observer.begin(name, task.kind)
            try:
                for hook in tuple(runtime.before_handle):
                    if await hook(name, task.kind) is DROP:
                        raise _Dropped(f"task {task.task_id} dropped by an injected fault")
                return await actor.run_task(task)
            finally:
                self._busy -= 1
                if observer is not None and self._busy == 0:
                    observer.end()


def start_task_getter(runtime: Runtime, master: str, node: str, process: str) -> TaskGetter | None:
    """Start pulling tasks for the task actors this worker process hosts, if any.

    Args:
        runtime: the worker's runtime, with its actors spawned.
        master: the master's endpoint.
        node: the node name; the worker id is ``node/process``.
        process: the worker process's name.

    Returns:
        The running getter, or None when no hosted actor is a TaskActor.
    """
    actors = [cell.actor for cell in runtime.cells.values() if isinstance(cell.actor, TaskActor)]
    if not actors:
        return None
    # an actor that names no kind runs every kind, and so does its worker
    every = any(not type(a).task_kinds for a in actors)
    kinds = () if every else tuple(sorted({k for a in actors for k in type(a).task_kinds}))
    config = GetterConfig(
        worker_id=f"{node}/{process}",
        node_id=node,
        slots=sum(type(a).slots for a in actors),
        gpu=sum(type(a).gpus for a in actors),
        kinds=kinds,
    )
    getter = TaskGetter(runtime, master, config, _ActorRunner(actors))
    install_task_control(runtime, {getter.worker_id: getter})
    runtime.start_soon(getter.run)
    log.info(
        "task_getter_started",
        master=master,
        worker=getter.worker_id,
        slots=config.slots,
        kinds=list(kinds) or "any",
    )
    return getter
