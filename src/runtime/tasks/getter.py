"""The worker's side of task dispatch: pull leases from the master, run them, report back.

A :class:`TaskGetter` speaks for one worker (``node/process``). It registers the worker with
the master, asks for tasks whenever it has a free slot, runs each leased task through its
runner (normally the worker's :class:`~troupe.runtime.tasks.task_actor.TaskActor`), renews its
leases every ``ttl / 3``, and reports ``complete`` (with the result reference) or ``fail``
(with the error text and traceback). Each report carries the next request, so a busy worker
costs the master one message per task. When nothing is pending the master holds the request (a
long poll of up to ``wait_s``) instead of making the worker poll.

Prefetch (``GetterConfig.prefetch``, default 1): the worker may hold that many leases beyond
its slots, waiting in the worker for a slot, so the next task starts the moment one ends
instead of one round trip (and one master batch) later. One is the default: it covers the round
trip whenever a task lasts longer than the round trip, which is what keeps short-task workers
busy (``bench scale`` at a thousand workers and 100 ms tasks, on two cores: efficiency 0.92
with two leases ahead against 0.83 with none); it costs long tasks nothing, since a worker whose last task
ran ``prefetch_wait_s`` or longer asks for none (below); and more than one holds more work
back behind a straggler at a job's tail while helping only tasks shorter than a round trip.
``prefetch=0`` gives one lease per slot, as before.

A worker with leases ahead asks on its own (``request_task``) only for empty slots; the leases
ahead come with the replies to its reports. One ``renew`` message renews every lease held,
running or waiting, whenever the first of them is due. A lease ahead that waited
``prefetch_wait_s`` for a slot is given back (``decline`` with ``given_back``: no attempt
counted) so that a worker stuck behind a slow task never sits on work others could do,
and the worker asks for no lease ahead again until one of its running copies ends. A worker
whose last task ran ``prefetch_wait_s`` or longer asks for none either: for long tasks the
round trip is small beside the task, and a lease ahead would only wait, then go back. A worker
that dies holding leases ahead loses nothing: they are leases like any other, requeued when
the worker leaves or they expire, and the master's commit rule still decides what is done.

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

A getter runs each slot as one long-lived coroutine that takes the held leases in turn, and
sends reports by reporters that wait for the next one once theirs is answered (a new one only
while all are busy): it spawns no task per lease, which at hundreds of getters a process was
their largest cost. A running copy is stopped through an asyncio timeout around its runner that
never fires on its own; the runner's own ``TimeoutError`` is an ordinary failure.

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
from collections import deque
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
from troupe.runtime.process_identity import process_identity

from .state import MAX_PREFETCH
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
        prefetch: leases held ahead of the slots, each waiting in the worker for a slot (0:
            none, one lease per slot). They hide the round trip to the master between two
            tasks; see the module docstring for why the default is 1.
        prefetch_wait_s: a lease ahead that waited this long for a slot is given back, and a
            worker whose last task ran this long asks for no lease ahead.
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
    prefetch: int = 1
    prefetch_wait_s: float = 2.0

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise TaskError(f"worker {self.worker_id}: slots must be >= 1, got {self.slots}")
        if not 0 <= self.prefetch <= MAX_PREFETCH:
            raise TaskError(
                f"worker {self.worker_id}: prefetch must be 0..{MAX_PREFETCH}, got {self.prefetch}"
            )
        if not self.prefetch_wait_s > 0:
            raise TaskError(
                f"worker {self.worker_id}: prefetch_wait_s must be > 0, got {self.prefetch_wait_s}"
            )


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
        waiting: leases held ahead now, waiting for a slot.
        given_back: leases ahead given back after waiting ``prefetch_wait_s``.
        withdrawn: leases ahead the master ended before they started (cancelled, renewal
            refused); never run, so not among ``cancelled``.
        renewals: renew messages sent (each renews every lease held).
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
    waiting: int = 0
    given_back: int = 0
    withdrawn: int = 0
    renewals: int = 0


class _Run:
    """One held lease: waiting for a slot, running, or reporting; what cancels it while it runs."""

    __slots__ = ("cancel_reason", "ended", "received", "renew_at", "stopper", "task", "ttl")

    def __init__(self, task: LeasedTask, now: float) -> None:
        self.task = task
        # While the runner runs: an asyncio timeout that never fires unless the copy must stop
        # (see TaskGetter._stop). A tenth of the cost of an anyio cancel scope per task.
        self.stopper: asyncio.Timeout | None = None
        self.cancel_reason = ""
        self.received = now
        self.ttl = task.ttl
        self.renew_at = now + _renew_period(task.ttl)
        self.ended = False  # the runner returned: no more renewals, the report is on its way


def _stop(run: _Run) -> None:
    """Stop a copy while its runner runs: its timeout fires now, the runner is cancelled and
    the copy ends unreported (no-op once the runner has returned)."""
    stopper = run.stopper
    if stopper is not None and not stopper.expired():
        stopper.reschedule(asyncio.get_running_loop().time())


def _renew_period(ttl: float) -> float:
    return max(ttl / 3.0, 0.01)


_NEVER = float("inf")


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
        # Every lease held, by id: waiting in _queue, running (_active of them), or reporting.
        self._held: dict[int, _Run] = {}
        self._queue: deque[_Run] = deque()
        self._active = 0
        # Leases ahead are asked for only while tasks are short: the last copy to end ran for
        # less than prefetch_wait_s (a longer one means a lease ahead would wait about as long,
        # then be given back), and no lease ahead was given back since it ended.
        self._ahead_ok = True
        self._want = asyncio.Event()
        # Each slot is one long-lived coroutine that runs the held leases in turn, and idle
        # reporters wait for the reports to send: no task is spawned per lease (anyio's spawn
        # was the largest cost of a simulated worker at a thousand workers a process).
        self._slot_wake = asyncio.Event()
        self._idle_reporters: list[asyncio.Future[tuple[_Run, str, dict[str, Any]]]] = []
        self._keeper_wake = asyncio.Event()
        self._keeper_until = 0.0  # when the lease keeper looks next, if not woken (monotonic)
        # Waiting leases are looked at this often: one given back has waited between
        # prefetch_wait_s and 1.5 times that, at one wake-up per look, not one per lease.
        self._look_s = config.prefetch_wait_s / 2.0
        self._registered = False
        # The leases the last request_task's reply carried, run or not since (reported, or
        # dropped by a fault): the next request names them held, so the master knows they
        # arrived and lets a dropped one expire as before.
        self._received: set[int] = set()
        # Reports sent and not yet answered (or given up), and whether a report's reply was
        # lost since the last request that said so (``sync``: see the request loop).
        self._reports_out = 0
        self._lost_grants = False
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
                "given_back",
                "withdrawn",
                "renewals",
            ),
            0,
        )

    # ------------------------------------------------------------------ life

    async def run(self) -> None:
        """Register, then pull and run tasks until cancelled."""
        structlog.contextvars.bind_contextvars(worker=self.worker_id)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._keep_leases)
            for _ in range(self.config.slots):
                tg.start_soon(self._slot)
            self._want.set()
            while True:
                await self._want.wait()
                self._want.clear()
                # Only a worker with a slot that nothing held will fill asks on its own, and
                # for those slots only: leases ahead come with the replies to its reports.
                free = self.config.slots - len(self._held)
                if free <= 0:
                    continue
                if not self._registered:
                    await self._register()
                    continue
                request = {
                    "worker_id": self.worker_id,
                    "free_slots": free,
                    "wait_s": self.config.wait_s,
                    # a lease the last request's reply carried that is not here never
                    # arrived: the master puts its task back (see _received)
                    "held": sorted(self._held.keys() | self._received),
                }
                # A report's lost reply lost the leases its request got too: with no report
                # out (whose reply may yet bring some), every lease not held goes back.
                sync = self._lost_grants and not self._reports_out
                if sync:
                    request["sync"] = True
                reply = await self._call(
                    "request_task", request, self.config.wait_s + self.config.call_timeout_s
                )
                if sync and reply is not None:
                    self._lost_grants = False
                self._counts["requests"] += 1
                leases = reply.get("leases", ()) if reply is not None else ()
                self._received = {
                    lease["lease_id"]
                    for lease in leases
                    if isinstance(lease, dict) and type(lease.get("lease_id")) is int
                }
                self._start(leases)
                if self._hungry():
                    if reply is None or not leases:
                        await anyio.sleep(self.config.retry_s if reply is None else 0.01)
                    self._want.set()

    def cancel(self, lease_id: int, reason: str) -> bool:
        """Stop the copy under ``lease_id``, running or waiting; return whether one was held."""
        run = self._held.get(lease_id)
        if run is None:
            return False
        run.cancel_reason = reason
        if run in self._queue:  # never started: nothing runs, nothing to report
            self._drop_waiting(run, reason)
        else:
            _stop(run)
        return True

    def statistics(self) -> GetterStats:
        """Return a snapshot of the counters."""
        c = self._counts
        return GetterStats(
            self._active,
            c["started"],
            c["completed"],
            c["failed"],
            c["declined"],
            c["cancelled"],
            c["registrations"],
            c["requests"],
            c["lost_reports"],
            len(self._queue),
            c["given_back"],
            c["withdrawn"],
            c["renewals"],
        )

    # ------------------------------------------------------------------ master calls

    def _free(self) -> int:
        """Leases the worker may take now: its slots and the leases ahead, less those held."""
        ahead = self.config.prefetch if self._ahead_ok else 0
        return self.config.slots + ahead - len(self._held)

    def _hungry(self) -> bool:
        """Whether a slot is free with no lease held to fill it (reports ask for the rest)."""
        return len(self._held) < self.config.slots

    async def _register(self) -> None:
        cfg = self.config
        reply = await self._call(
            "register_worker",
            {
                "worker_id": cfg.worker_id,
                "node": cfg.node_id,
                "endpoint": self.runtime.address,
                "pid": os.getpid(),
                "process": process_identity(),  # a rerun on this host tells at once that it died
                "slots": cfg.slots,
                "cpu": float(cfg.slots if cfg.cpu is None else cfg.cpu),
                "gpu": cfg.gpu,
                "kinds": list(cfg.kinds),
                "prefetch": cfg.prefetch,
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
        """Hold the leases a reply carried and start as many as slots are free."""
        now = time.monotonic()
        for raw in leases or ():
            try:
                task = LeasedTask.from_wire(raw)
            except BadFrame as exc:  # the lease will expire on the master and be retried
                log.error("lease_malformed", error=str(exc))
                continue
            run = _Run(task, now)
            self._held[task.lease_id] = run
            self._queue.append(run)
            # the keeper sleeps until its next look is due: wake it only to look sooner
            if self._next_look(run, now) < self._keeper_until:
                self._keeper_wake.set()
        self._fill()

    def _next_look(self, run: _Run, now: float) -> float:
        """When the keeper must look at a lease just received (see _keep_leases)."""
        return min(run.renew_at, now + self._look_s) if self.config.prefetch else run.renew_at

    def _fill(self) -> None:
        """Wake the idle slots when a lease waits for one."""
        if self._queue and self._active < self.config.slots:
            self._slot_wake.set()

    async def _slot(self) -> None:
        """One slot: run the leases held, one after another, in the order they came."""
        while True:
            while not self._queue or self._active >= self.config.slots:
                self._slot_wake.clear()
                await self._slot_wake.wait()
            run = self._queue.popleft()
            self._active += 1
            self._counts["started"] += 1
            await self._execute(run)

    def _drop_waiting(self, run: _Run, reason: str) -> None:
        self._queue.remove(run)
        self._held.pop(run.task.lease_id, None)
        self._counts["withdrawn"] += 1
        log.info("waiting_lease_dropped", task_id=run.task.task_id, lease_id=run.task.lease_id, reason=reason)
        self._want.set()

    async def _execute(self, run: _Run) -> None:
        """Run one copy in the calling slot; its report goes to the reporter."""
        task = run.task
        # the slot's context outlives the copy: the previous copy's actor is not this one's
        structlog.contextvars.unbind_contextvars("actor")
        structlog.contextvars.bind_contextvars(task_id=task.task_id, lease_id=task.lease_id)
        if self.runtime.progress_hooks:  # the note is formatted only for someone who reads it
            self.runtime.progress(1, f"task {task.task_id} started")
        report: tuple[str, dict[str, Any]] | None = None
        began = time.monotonic()
        handed = False
        try:
            try:
                async with asyncio.timeout(None) as stopper:
                    run.stopper = stopper
                    try:
                        if self.config.kinds and task.kind not in self.config.kinds:
                            raise KindNotRun(
                                f"worker {self.worker_id} runs kinds "
                                f"{list(self.config.kinds)}, not {task.kind!r}"
                            )
                        result = await self._runner(task)
                        run_s = round(time.monotonic() - began, 6)
                        report = ("complete", {"result_ref": result or "", "run_s": run_s})
                    except KindNotRun as exc:  # not an attempt: the master leases it elsewhere
                        report = ("decline", {"reason": str(exc), "kind": task.kind})
                    except _Dropped as exc:  # lost on purpose: no report, the lease expires
                        run.cancel_reason = str(exc)
                    except Exception as exc:  # the runner's own TimeoutError included
                        error = f"{type(exc).__qualname__}: {exc}"
                        tb = "".join(traceback.format_exception(exc))
                        report = ("fail", {"error": error, "traceback": tb})
                        # In the worker's node's log too, where `troupe logs tail --task` looks:
                        # the master's own log was the only one to say a task failed.
                        log.warning("task_failed", error=error, attempt=task.attempt, traceback=tb)
                    finally:
                        run.stopper = None
            except TimeoutError:  # only _stop's: the runner's own were caught above
                report = None
            finally:
                # The slot is free once the runner returns: the next lease held starts now,
                # while this copy's report is on its way.
                run.ended = True
                self._active -= 1
                self._ahead_ok = time.monotonic() - began < self.config.prefetch_wait_s
            if report is None:  # cancelled by the master or by a refused renewal
                self._counts["cancelled"] += 1
                log.info("task_cancelled", reason=run.cancel_reason)
                return
            self._hand_report(run, *report)
            handed = True
        finally:
            if not handed:
                self._ended(run)

    def _ended(self, run: _Run) -> None:
        """A copy is over (reported, or never to be): forget its lease, ask for work."""
        self._held.pop(run.task.lease_id, None)
        if self.runtime.progress_hooks:
            self.runtime.progress(1, f"task {run.task.task_id} ended")
        if self._hungry():  # otherwise the report's reply or a lease held fills the slot
            self._want.set()

    def _hand_report(self, run: _Run, kind: str, fields: dict[str, Any]) -> None:
        """Send a report by an idle reporter, or by a new one when all are busy (one report
        retried while the master is away never holds up another). Reporters stay for the
        next reports: a worker pays for as many as it ever had reports in flight at once."""
        while self._idle_reporters:
            waiting = self._idle_reporters.pop()
            if not waiting.done():
                waiting.set_result((run, kind, fields))
                return
        assert self._tg is not None
        self._tg.start_soon(self._reporter, (run, kind, fields))

    async def _reporter(self, first: tuple[_Run, str, dict[str, Any]]) -> None:
        # started from a slot, whose task the context names: a reporter's logs name each
        # report's task themselves (see _report)
        structlog.contextvars.unbind_contextvars("task_id", "lease_id", "actor")
        item = first
        loop = asyncio.get_running_loop()
        while True:
            await self._report_one(*item)
            waiting: asyncio.Future[tuple[_Run, str, dict[str, Any]]] = loop.create_future()
            self._idle_reporters.append(waiting)
            item = await waiting

    async def _report_one(self, run: _Run, kind: str, fields: dict[str, Any]) -> None:
        try:
            await self._report(run, kind, fields)
        finally:
            self._ended(run)

    # ------------------------------------------------------------------ held leases

    async def _keep_leases(self) -> None:
        """Renew every held lease together, and give back leases ahead that waited too long.

        One renew message covers every lease held (running or waiting) whenever the first of
        them is due (a third of its TTL since it was received or last renewed).
        """
        while True:
            now = time.monotonic()
            for run in [r for r in self._queue if now - r.received >= self.config.prefetch_wait_s]:
                self._give_back(run)
            live = [r for r in self._held.values() if not r.ended]
            if any(r.renew_at <= now for r in live):
                await self._renew(live)
                continue
            until = min((r.renew_at for r in live), default=_NEVER)
            if self._queue or (live and self.config.prefetch):
                # a worker that may hold leases ahead looks every look_s while it holds
                # any, so that a lease ahead arriving does not wake it each time
                until = min(until, now + self._look_s)
            self._keeper_until = until
            if until == _NEVER:  # nothing held: a lease that comes wakes it (see _start)
                self._keeper_wake.clear()
                await self._keeper_wake.wait()
                continue
            self._keeper_wake.clear()
            # a bare loop timer, not a cancel scope: a thousand getters in one process look
            # about once a second each, and a scope that times out costs an exception
            timer = asyncio.get_running_loop().call_later(until - now, self._keeper_wake.set)
            try:
                await self._keeper_wake.wait()
            finally:
                timer.cancel()

    async def _renew(self, runs: list[_Run]) -> None:
        now = time.monotonic()
        for run in runs:  # answered or not, the next try is a period away
            run.renew_at = now + _renew_period(run.ttl)
        first, *more = runs
        payload: dict[str, Any] = {
            "worker_id": self.worker_id,
            "task_id": first.task.task_id,
            "lease_id": first.task.lease_id,
        }
        if more:
            payload["more"] = [[r.task.task_id, r.task.lease_id] for r in more]
        self._counts["renewals"] += 1
        try:
            reply = await self.runtime.control(
                self.master, "renew", payload, timeout=self.config.call_timeout_s
            )
        except TaskError as exc:  # unknown worker included: the leases are gone either way
            reply = {
                "outcome": "rejected",
                "reason": str(exc),
                "more": [
                    {"lease_id": r.task.lease_id, "outcome": "rejected", "reason": str(exc)} for r in more
                ],
            }
        except TroupeError as exc:  # down, restarting, or a passing fault: try next period
            log.info("renew_failed", error=str(exc))
            return
        answers = {first.task.lease_id: reply}
        for answer in reply.get("more", ()):
            if isinstance(answer, dict) and type(answer.get("lease_id")) is int:
                answers[answer["lease_id"]] = answer
        for run in runs:
            answer = answers.get(run.task.lease_id)
            if answer is None or run.task.lease_id not in self._held:
                continue  # not answered (try next period), or ended meanwhile
            if answer.get("outcome") != "renewed":
                reason = f"renewal refused: {answer.get('reason', answer)}"
                run.cancel_reason = reason
                if run in self._queue:
                    self._drop_waiting(run, reason)
                elif not run.ended:
                    _stop(run)
                continue
            run.ttl = float(answer.get("ttl", run.ttl))
            run.renew_at = time.monotonic() + _renew_period(run.ttl)

    def _give_back(self, run: _Run) -> None:
        """Return a lease ahead that waited ``prefetch_wait_s``: another worker may run it now."""
        assert self._tg is not None
        self._queue.remove(run)
        run.ended = True
        self._ahead_ok = False
        self._counts["given_back"] += 1
        log.info(
            "prefetched_lease_given_back",
            task_id=run.task.task_id,
            lease_id=run.task.lease_id,
            waited_s=round(time.monotonic() - run.received, 3),
        )
        self._tg.start_soon(self._return_lease, run)

    async def _return_lease(self, run: _Run) -> None:
        task = run.task
        payload = {
            "worker_id": self.worker_id,
            "task_id": task.task_id,
            "lease_id": task.lease_id,
            "reason": f"waited {self.config.prefetch_wait_s}s in the worker for a slot",
            "given_back": True,
            "request": 0,
        }
        try:
            # one try: a lease the master never hears of expires there and is leased again
            await self.runtime.control(self.master, "decline", payload, timeout=self.config.call_timeout_s)
        except TroupeError as exc:
            log.info("give_back_failed", task_id=task.task_id, error=str(exc))
        finally:
            self._held.pop(task.lease_id, None)
            self._want.set()

    async def _report(self, run: _Run, kind: str, fields: dict[str, Any]) -> None:
        task = run.task
        cfg = self.config
        payload = {"worker_id": self.worker_id, "task_id": task.task_id, "lease_id": task.lease_id, **fields}
        ids = {"task_id": task.task_id, "lease_id": task.lease_id}  # the reporter has no task context
        deadline = time.monotonic() + cfg.report_for_s
        self._reports_out += 1
        try:
            while True:
                # The slot of this copy is free once the report is in: ask for the next task
                # with it.
                payload["request"] = self._free() + 1 if self._registered else 0
                try:
                    reply = await self.runtime.control(self.master, kind, payload, timeout=cfg.call_timeout_s)
                    break
                except UnknownWorker:
                    self._registered = False
                    payload["request"] = 0
                except _TRANSIENT as exc:
                    log.info("report_failed", report=kind, error=str(exc), **ids)
                    # its reply, lost, may have carried leases: they hold this worker's slots
                    # at the master until they expire, unless a request says so (``sync``)
                    self._lost_grants = self._lost_grants or payload["request"] > 0
                except TroupeError as exc:  # refused outright: sending it again changes nothing
                    self._counts["lost_reports"] += 1
                    log.warning("report_refused", report=kind, error=str(exc), **ids)
                    return
                if time.monotonic() >= deadline:
                    self._counts["lost_reports"] += 1
                    log.warning("report_dropped", report=kind, after_s=cfg.report_for_s, **ids)
                    return
                await anyio.sleep(cfg.retry_s)
        finally:
            self._reports_out -= 1
        self._counts[{"complete": "completed", "fail": "failed"}.get(kind, "declined")] += 1
        if reply.get("outcome") == "rejected":
            log.warning("report_rejected", report=kind, reason=reply.get("reason"), **ids)
        if not reply.get("known", True):
            self._registered = False
        self._held.pop(task.lease_id, None)
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
            counts = runtime.cells[name].more_counts if name in runtime.cells else {}
            try:
                for hook in tuple(runtime.before_handle):
                    if await hook(name, task.kind) is DROP:
                        raise _Dropped(f"task {task.task_id} dropped by an injected fault")
                ref = await actor.run_task(task)
            except _Dropped:
                raise
            except Exception:
                counts["tasks_failed"] = counts.get("tasks_failed", 0) + 1
                raise
            else:
                # A task actor handles few messages: its status counts the tasks it ran.
                counts["tasks_done"] = counts.get("tasks_done", 0) + 1
                return ref
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
    for cell in runtime.cells.values():
        if isinstance(cell.actor, TaskActor):  # counted from the start: "0 tasks" says it runs them
            cell.more_counts.update(tasks_done=0, tasks_failed=0)
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
