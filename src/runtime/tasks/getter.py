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
cancelled) or when a renewal is refused (the lease ended: expired, requeued, or an older copy
of a task after a master restart); it is then not reported. A master that does not answer is
retried, and so is one that answers with a ``JournalError`` (its journal failed to keep the
batch that held the call, and it is stopping: the master restarted on that journal holds the
task over as leased, and takes the report sent again); one that forgot the worker (it
restarted) answers ``unknown_worker`` and the getter registers again. A restarted master holds
each lease over for its holder: the getter's next ``renew`` (the same lease ids) keeps its
copies running, and its answer's ``known: false`` has the getter register again at once, busy
or not, so the master knows who holds them. A report is sent until a master answers it, however
long the master is down: the one restarted on the journal holds the lease over and takes it,
and the task runs once (``report_for_s`` bounds it: a report dropped leaves the lease to run
out there, and the task to run again). A ``complete`` the master refuses (a result reference
that is not a str, from a runner that does not check it), or that this worker's codec cannot
send (a str with a lone surrogate, one over the message bound), is sent again as a ``fail``
carrying the refusal, worded as the master's or as the worker's own: the attempt fails at once,
instead of holding the task until its lease expired and blaming the lease. How a report is sent
is :mod:`~troupe.runtime.tasks.report_until_answered`, which a pipeline run's source of a
cluster's job sends its reports with too.

A getter runs each slot as one long-lived coroutine that takes the held leases in turn, and
sends reports by reporters that wait for the next one once theirs is answered (a new one only
while all are busy): it spawns no task per lease, which at hundreds of getters a process was
their largest cost. A running copy is stopped through an asyncio timeout around its runner that
never fires on its own; the runner's own ``TimeoutError`` is an ordinary failure.

The leases held are kept (renewed, given back, stopped when the master ends them) by the
getter's base, :class:`~troupe.runtime.tasks.held_leases.HeldLeases`. What runs a lease is a
runner (:mod:`troupe.runtime.tasks.task_runner`); in a worker process,
:func:`~troupe.runtime.tasks.getter_start.start_task_getter` builds the getter from the hosted
task actors, and the ``scale`` benchmark runs hundreds of getters with a sleeping runner in one
process.
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from typing import Any

import anyio
import structlog

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import (
    BadFrame,
    TroupeError,
    UnknownWorker,
)
from troupe.runtime.library_logging import get_logger
from troupe.runtime.process_identity import process_identity

from .getter_config import GetterConfig
from .held_leases import HeldLease, HeldLeases
from .report_until_answered import TRANSIENT, report_until_answered
from .task_actor import LeasedTask
from .task_runner import KindNotRun, Runner, TaskDropped

# GetterConfig stays importable from here: the README documents it as the getter's settings.
__all__ = ["GetterConfig", "TaskGetter"]

log = get_logger(__name__)

_COUNTED = {"complete": "completed", "fail": "failed"}  # the counter of a report answered (else declined)


class TaskGetter(HeldLeases):
    """Pulls tasks for one worker from the master and runs them.

    Args:
        runtime: the worker process's runtime (it sends the control messages).
        master: the master's endpoint.
        config: who the worker is and how it asks.
        runner: runs one leased task.
    """

    def __init__(self, runtime: Runtime, master: str, config: GetterConfig, runner: Runner) -> None:
        super().__init__(runtime, master, config)
        self._runner = runner
        # Each slot is one long-lived coroutine that runs the held leases in turn, and idle
        # reporters wait for the reports to send: no task is spawned per lease (anyio's spawn
        # was the largest cost of a simulated worker at a thousand workers a process).
        self._slot_wake = asyncio.Event()
        self._idle_reporters: list[asyncio.Future[tuple[HeldLease, str, dict[str, Any]]]] = []
        self._registered = False
        # The leases the last request_task's reply carried, run or not since (reported, or
        # dropped by a fault): the next request names them held, so the master knows they
        # arrived and lets a dropped one expire as before.
        self._received: set[int] = set()
        # Reports sent and not yet answered (or given up), and whether a report's reply was
        # lost since the last request that said so (``sync``: see the request loop).
        self._reports_out = 0
        self._lost_grants = False

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
                # Registered even with every slot busy: a restarted master renews the leases
                # it held over, and then learns who holds them (see _forgotten).
                if not self._registered:
                    await self._register()
                    continue
                # Only a worker with a slot that nothing held will fill asks on its own, and
                # for those slots only: leases ahead come with the replies to its reports.
                free = self.config.slots - len(self._held)
                if free <= 0:
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

    # ------------------------------------------------------------------ master calls

    def _forgotten(self) -> None:
        self._registered = False
        self._want.set()

    def _forgotten_since(self, registrations: int) -> None:
        """A report's answer said the master does not know this worker: register again, unless a
        registration came after the report was sent (the answer is older than it): two reports
        answered so together would register twice, a call for nothing (the master keeps the
        leases of a process that registers again)."""
        if registrations == self._counts["registrations"]:
            self._forgotten()

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
        except TRANSIENT as exc:
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
            run = HeldLease(task, now)
            self._held[task.lease_id] = run
            self._queue.append(run)
            # the keeper sleeps until its next look is due: wake it only to look sooner
            if self._next_look(run, now) < self._keeper_until:
                self._keeper_wake.set()
        self._fill()

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

    async def _execute(self, run: HeldLease) -> None:
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
                    except TaskDropped as exc:  # lost on purpose: no report, the lease expires
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
            except TimeoutError:  # only HeldLeases' stop: the runner's own were caught above
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

    def _ended(self, run: HeldLease) -> None:
        """A copy is over (reported, or never to be): forget its lease, ask for work."""
        self._held.pop(run.task.lease_id, None)
        if self.runtime.progress_hooks:
            self.runtime.progress(1, f"task {run.task.task_id} ended")
        if self._hungry():  # otherwise the report's reply or a lease held fills the slot
            self._want.set()

    # ------------------------------------------------------------------ reports

    def _hand_report(self, run: HeldLease, kind: str, fields: dict[str, Any]) -> None:
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

    async def _reporter(self, first: tuple[HeldLease, str, dict[str, Any]]) -> None:
        # started from a slot, whose task the context names: a reporter's logs name each
        # report's task themselves (see _report)
        structlog.contextvars.unbind_contextvars("task_id", "lease_id", "actor")
        item = first
        loop = asyncio.get_running_loop()
        while True:
            await self._report_one(*item)
            waiting: asyncio.Future[tuple[HeldLease, str, dict[str, Any]]] = loop.create_future()
            self._idle_reporters.append(waiting)
            item = await waiting

    async def _report_one(self, run: HeldLease, kind: str, fields: dict[str, Any]) -> None:
        try:
            await self._report(run, kind, fields)
        finally:
            self._ended(run)

    async def _report(self, run: HeldLease, kind: str, fields: dict[str, Any]) -> None:
        task = run.task
        cfg = self.config
        payload = {"worker_id": self.worker_id, "task_id": task.task_id, "lease_id": task.lease_id, **fields}
        registrations = self._counts["registrations"]

        def before(payload: dict[str, Any]) -> None:
            nonlocal registrations
            # The slot of this copy is free once the report is in: ask for the next task with it.
            payload["request"] = self._free() + 1 if self._registered else 0
            registrations = self._counts["registrations"]

        async def forgotten(payload: dict[str, Any]) -> None:
            self._forgotten_since(registrations)

        def unanswered(payload: dict[str, Any], exc: TroupeError) -> None:
            # its reply, lost, may have carried leases: they hold this worker's slots at the
            # master until they expire, unless a request says so (``sync``)
            self._lost_grants = self._lost_grants or payload["request"] > 0

        self._reports_out += 1
        try:
            # report_for_s None: sent until a master answers it, however long the master is
            # down (report jx 3); the reporter has no task context: the log lines name its ids
            answered = await report_until_answered(
                self.runtime,
                self.master,
                kind,
                payload,
                timeout=cfg.call_timeout_s,
                retry_s=cfg.retry_s,
                forgotten=forgotten,
                ids={"task_id": task.task_id, "lease_id": task.lease_id},
                report_for_s=cfg.report_for_s,
                before=before,
                unanswered=unanswered,
            )
        finally:
            self._reports_out -= 1
        if answered is None:
            self._counts["lost_reports"] += 1
            return
        kind, reply = answered
        rejected = reply.get("outcome") == "rejected"
        # a complete rejected is no completion (its attempt failed at the master, lo 1), and
        # counted completed it hid the failure; a fail or decline rejected is still what it says
        counted = "rejected" if rejected and kind == "complete" else _COUNTED.get(kind, "declined")
        self._counts[counted] += 1
        if rejected:
            log.warning(
                "report_rejected",
                report=kind,
                counted=counted,
                reason=reply.get("reason"),
                task_id=task.task_id,
                lease_id=task.lease_id,
            )
        if not reply.get("known", True):
            self._forgotten_since(registrations)
        self._held.pop(task.lease_id, None)
        self._start(reply.get("leases", ()))
