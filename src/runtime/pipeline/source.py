"""Where a pipeline's items come from: a seed range, or a job's tasks leased from the master.

An item source hands the engine items while its first queue has room, learns how each item
ended (``settle``), and says when no more will come. With :class:`MasterSource` the pipeline is
one consumer of a job: it leases the job's tasks as a worker does, keeps the leases of the items
in flight renewed, and reports each item's end (until a master answers it, as a worker's getter
does: ``tasks/report_until_answered.py``), so that the master's journal, retries with
backoff and dead letters cover the pipeline too (an item that errs is failed back to the
master, which leases it again later or dead-letters it).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from troupe.runtime.core.control_payloads import ControlPayload
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import (
    AskTimeout,
    PeerLost,
    TroupeError,
    UnknownMessageType,
    UnknownWorker,
    Unreachable,
)
from troupe.runtime.library_logging import get_logger
from troupe.runtime.process_identity import process_identity
from troupe.runtime.tasks.jobspec import generated_task_id
from troupe.runtime.tasks.report_until_answered import report_until_answered

__all__ = ["ItemSource", "LocalSource", "MasterSource", "SourceItem", "send_unanswered"]

log = get_logger(__name__)

# How long a stopping run's last messages (to the master, to the replicas' nodes) wait: enough
# to leave this process (its sockets close without lingering), not for the answers nobody reads.
_STOP_TELL_S = 0.5
_SILENT_RETRY_S = 0.5  # the pause after a call the master did not answer
_DONE_CHUNK = 50_000  # task ids per done_tasks question: a few MB a message at most
_TTL_S = 60.0  # a lease's life, as the renewals are timed, where the master said none
_RENEW_AT = "renew_at"  # a held lease's key: when it is next renewed (time.monotonic)


async def send_unanswered(runtime: Runtime, endpoint: str, msg_type: str, payload: Any) -> None:
    """Send a control message from a run being cancelled, whose runtime reads no more replies:
    it leaves, and nobody waits for the answer (nor hears of a peer that is gone)."""
    with anyio.CancelScope(shield=True):
        try:
            await runtime.control(endpoint, msg_type, payload, timeout=_STOP_TELL_S)
        except TroupeError:
            pass


def _renew_next_after(lease: dict[str, Any]) -> None:
    """Time the lease's next renewal a period from now: a third of its TTL (at least 0.5 s)."""
    lease[_RENEW_AT] = time.monotonic() + max(float(lease.get("ttl") or _TTL_S) / 3, 0.5)


@dataclass(frozen=True, slots=True)
class SourceItem:
    """One item as its source hands it over."""

    task_id: str
    seed: int
    attempt: int = 0


class ItemSource(Protocol):
    """What the engine needs from a source of items."""

    retries_locally: bool
    """True: the engine retries an erring item itself; False: it settles it as ``error``."""

    def take(self, n: int) -> list[SourceItem]:
        """Up to ``n`` items available now (never waits)."""
        ...

    def exhausted(self) -> bool:
        """No item will ever come again."""
        ...

    def settle(self, task_id: str, outcome: str, error: str = "", traceback: str = "") -> None:
        """An item ended: ``ok``, ``pruned``, ``dead`` or (not retried locally) ``error``."""
        ...

    async def run(self, wake: Callable[[], None]) -> None:
        """Background work (leasing, renewing); calls ``wake`` when items arrive or it ends."""
        ...

    async def release(self) -> None:
        """The run stops before its items ended (cancelled): give back what it holds, without
        waiting for answers (a cancelled runtime reads none)."""
        ...

    def halted(self) -> str | None:
        """Why the run must stop now with its items unfinished (the job was cancelled where the
        items come from), as a line for people; None while it may go on."""
        ...

    async def ended_ok(self, task_ids: Iterable[str]) -> set[str]:
        """Those of ``task_ids`` that earlier runs ended ok (their outputs were made), which
        this source will therefore never hand out again."""
        ...


class LocalSource:
    """Items for seeds ``seed_start .. seed_start + count - 1``, ids ``{name}-{i:06d}``."""

    retries_locally = True

    def __init__(self, name: str, count: int, seed_start: int = 0) -> None:
        self.name = name
        self.count = count
        self.seed_start = seed_start
        self._next = 0

    def take(self, n: int) -> list[SourceItem]:
        out = []
        while n > 0 and self._next < self.count:
            out.append(SourceItem(generated_task_id(self.name, self._next), self.seed_start + self._next))
            self._next += 1
            n -= 1
        return out

    def exhausted(self) -> bool:
        return self._next >= self.count

    def settle(self, task_id: str, outcome: str, error: str = "", traceback: str = "") -> None:
        """Nothing to report to: the engine keeps the outcomes."""

    async def run(self, wake: Callable[[], None]) -> None:
        """Nothing to do in the background."""

    async def release(self) -> None:
        """Nothing held: the engine's outcomes are the whole record."""

    def halted(self) -> str | None:
        """Never: nobody else can cancel a seed range."""
        return None

    async def ended_ok(self, task_ids: Iterable[str]) -> set[str]:
        """None: a seed range hands out every item again in each run."""
        return set()


class MasterSource:
    """A job's tasks, leased from the master like a worker with ``slots`` slots.

    Args:
        runtime: a runtime that can reach the master.
        master: the master endpoint.
        job_id: the submitted job whose tasks to run.
        slots: how many leases to hold at once (items queued or in flight).
        kind: the task kind it runs (default: ``job_id``, as the pipeline's job is submitted):
            the master leases it tasks of that kind only, never another job's.
        master_outlives_run: the master goes on after the run (a cluster's): a cancelled run
            gives its leases back (``release``). False for a master started for the run alone,
            which takes them back itself when it next starts on its journal.
        worker_id: the id this consumer registers under.
        poll_s: how long one request for tasks may be held by the master.
        report_window_s: how long an item's end waits for others to be reported with it.
    """

    retries_locally = False

    def __init__(
        self,
        runtime: Runtime,
        master: str,
        job_id: str,
        slots: int,
        worker_id: str | None = None,
        poll_s: float = 1.0,
        report_window_s: float = 0.1,
        kind: str | None = None,
        master_outlives_run: bool = True,
    ) -> None:
        self.runtime = runtime
        self.master = master
        self.job_id = job_id
        self.kind = job_id if kind is None else kind
        self.master_outlives_run = master_outlives_run
        # Told, as a line for people, when the master stops answering and when it answers again
        # (the run waits for it meanwhile: without a word, it would look hung).
        self.on_event: Callable[[str], None] | None = None
        self._unanswered_since: float | None = None
        self.slots = slots
        self.worker_id = worker_id or f"{runtime.node}/pipeline-{os.getpid()}"
        self.poll_s = poll_s
        self.report_window_s = report_window_s
        self._ready: deque[SourceItem] = deque()
        self._leases: dict[str, dict[str, Any]] = {}  # task_id -> lease, while in the pipeline
        self._received: set[int] = set()  # the lease ids the last request's reply carried
        self._reports: deque[tuple[str, dict[str, Any]]] = deque()
        self._sending: list[tuple[str, dict[str, Any]]] = []  # reports no master answered yet
        self._kick = anyio.Event()
        self._lease_came = anyio.Event()  # wakes the renew loop: a new lease may be due first
        self._window = anyio.Event()  # set when the last lease out settles: no report can join
        self._done = False
        self.dead: dict[str, str] = {}
        # A lease the master took back, or a renewal it refused: the job may have been
        # cancelled, and the loop asks the master for its state (``_look_at_job``).
        self._suspect = False
        self._halted: str | None = None
        self.cancelled_before = False  # the job was cancelled before the run (master_job sets it)
        self.ended_before: int | None = None  # its tasks ended as the run began (None: not told)
        self.dead_before: set[str] = set()  # of them, those dead-lettered (master_job sets it)
        # The job as the master made it: its id and submission time, which tell it from a job
        # made anew under the same name (a master that lost its journal); None: not told.
        self.made: dict[str, Any] | None = None  # (master_job sets it)
        # While the lease loop runs: its task group, and the engine's wake (``_report_last``).
        self._ending: tuple[anyio.abc.TaskGroup, Callable[[], None]] | None = None
        # Registrations sent again (see _register_again), and whether one is on its way now.
        self._registrations = 0
        self._registering = False

    def take(self, n: int) -> list[SourceItem]:
        out = []
        while n > 0 and self._ready:
            out.append(self._ready.popleft())
            n -= 1
        if out:
            self._kick.set()  # room freed: ask for more
        return out

    def exhausted(self) -> bool:
        return self._done and not self._ready

    def settle(self, task_id: str, outcome: str, error: str = "", traceback: str = "") -> None:
        lease = self._leases.pop(task_id, None)
        if lease is None:
            return
        base = {"worker_id": self.worker_id, "task_id": task_id, "lease_id": lease["lease_id"], "request": 0}
        if outcome in ("ok", "pruned"):
            self._reports.append(("complete", {**base, "result_ref": outcome}))
        else:
            self._reports.append(("fail", {**base, "error": error or outcome, "traceback": traceback}))
        self._kick.set()
        if not self._leases:
            self._window.set()
            if self._ending is not None and self._halted is None:
                self._ending[0].start_soon(self._report_last, self._ending[1])

    def halted(self) -> str | None:
        return self._halted

    async def ended_ok(self, task_ids: Iterable[str]) -> set[str]:
        """Asked of the master (``done_tasks``), a chunk at a time; a task pruned is done with
        no output (``result_ref`` "pruned") and is not among them. Nothing is asked (nor
        ``task_ids`` read) where no task of the job had ended as the run began.

        Raises:
            TroupeError: the master did not answer.
        """
        ended: set[str] = set()
        if self.ended_before == 0:
            return ended
        ids = iter(task_ids)
        while chunk := list(itertools.islice(ids, _DONE_CHUNK)):
            try:
                done = await self.runtime.control(
                    self.master, "done_tasks", {"job_id": self.job_id, "task_ids": chunk}, timeout=60
                )
            except UnknownMessageType:  # a master older than the question: nothing to compare
                log.warning("pipeline_outputs_unchecked", job_id=self.job_id, why="no done_tasks there")
                return set()
            ended.update(str(t) for t, ref in (done or {}).items() if ref != "pruned")
        return ended

    async def run(self, wake: Callable[[], None]) -> None:
        await self._call("register_worker", self._registration())
        # The master tells a worker whose lease it takes back (``cancel_lease``); the run's
        # runtime answers for this source, unless another part of the process does already.
        answers = "cancel_lease" not in self.runtime.control_handlers
        if answers:
            self.runtime.register_control("cancel_lease", self._lease_taken_back)
        try:
            await self._lease_loop(wake)
        finally:
            self._ending = None  # the lease loop's task group is closed: nothing more starts there
            if answers:
                self.runtime.unregister_control("cancel_lease")
        if self.master_outlives_run and self._halted is None:  # off the master's list
            await self._call(
                "worker_left", {"worker_id": self.worker_id, "pid": os.getpid(), "reason": "run ended"}
            )
        wake()

    async def _report_last(self, wake: Callable[[], None]) -> None:
        """The last lease out settled: its report, and the job's end, go now, beside the loop's
        request in flight (held by the master up to ``poll_s`` while no task waits), which
        they waited for at every run's end."""
        await self._flush_reports()
        await self._check_finished()
        if self._done:
            wake()

    async def _lease_loop(self, wake: Callable[[], None]) -> None:
        async with anyio.create_task_group() as tg:
            self._ending = (tg, wake)
            tg.start_soon(self._renew_loop)
            while not self._done:
                if self._reports and self._leases and self.report_window_s > 0:
                    # Let a few reports gather: the master journals what arrives together in
                    # one transaction, and the freed slots go in one request. With no lease
                    # left, no report can join them: the job's end is told at once, also when
                    # its last lease settles inside the window.
                    self._window = anyio.Event()
                    with anyio.move_on_after(self.report_window_s):
                        await self._window.wait()
                if self._suspect:
                    await self._look_at_job()
                    if self._halted is not None:
                        break
                await self._flush_reports()
                await self._check_finished()  # cheap; ends the run as soon as the job is over
                if self._done:
                    break
                free = self.slots - len(self._leases)
                if free > 0:
                    # A lease an earlier reply carried that is not held here never arrived (the
                    # master paused past the call's timeout, then answered the requests queued
                    # meanwhile): named held, the master puts the others back at once, where the
                    # run's slots stayed taken there until the leases expired (minutes).
                    held = {int(lease["lease_id"]) for lease in self._leases.values()} | self._received
                    reply = await self._call(
                        "request_task",
                        {
                            "worker_id": self.worker_id,
                            "free_slots": free,
                            "wait_s": self.poll_s,
                            "held": sorted(held),
                        },
                    )
                    leases = (reply or {}).get("leases", [])
                    self._received = {int(lease["lease_id"]) for lease in leases}
                    for lease in leases:
                        _renew_next_after(lease)
                        self._leases[lease["task_id"]] = lease
                        self._ready.append(
                            SourceItem(lease["task_id"], int(lease["seed"]), int(lease["attempt"]))
                        )
                    if leases:
                        self._lease_came.set()  # the renewals are timed from now
                        wake()
                else:
                    self._kick = anyio.Event()
                    with anyio.move_on_after(self.poll_s):
                        await self._kick.wait()
            if self._halted is None:
                await self._flush_reports()
            tg.cancel_scope.cancel()

    async def _lease_taken_back(self, payload: Any) -> bool:
        """The master's ``cancel_lease``: the job was cancelled, or the lease expired or went to
        another copy. Which one, the loop asks the master (a control handler must not wait)."""
        p = ControlPayload("cancel_lease", payload)
        if p.require("worker_id", str) != self.worker_id:
            return False
        if p.optional("task_id", str, "") not in self._leases:
            return False
        self._suspect = True
        self._kick.set()
        return True

    async def _look_at_job(self) -> None:
        """Halt the run if its job was cancelled at the master: it leases nothing more, and the
        engine stops the items in flight (their leases are the master's again already)."""
        self._suspect = False
        view = await self._call("wait_job", {"job_id": self.job_id, "timeout_s": 0})
        if isinstance(view, dict) and view.get("state") == "cancelled":
            self._halt(view)

    def _halt(self, view: dict[str, Any]) -> None:
        done = (view.get("counts") or {}).get("done", 0)
        self._halted = (
            # The master's count: an item a stage committed whose report the cancel overtook
            # is not among them, yet its output stays (a cancel landed mid-commit said 9, with 37).
            f"the master's job {self.job_id!r} was cancelled (`troupe ctl cancel`) with {done} of "
            f"{view.get('total')} items recorded done: the run stopped, and its replicas with it; "
            "what the stages committed stays, also that of items in flight (the same command run "
            "again finalises the output with it)"
        )
        log.warning("pipeline_job_cancelled", job_id=self.job_id, done=done)
        self._done = True
        self._ready.clear()
        self._leases.clear()  # nothing to give back: the master took them
        self._reports.clear()  # ends the master ignores: the tasks are cancelled

    def _registration(self) -> dict[str, Any]:
        """What this source registers with the master as, a worker with ``slots`` slots."""
        return {
            "worker_id": self.worker_id,
            "node": self.runtime.node,
            "endpoint": self.runtime.address,
            "pid": os.getpid(),
            "process": process_identity(),  # a rerun on this host tells at once that it died
            "slots": self.slots,
            "cpu": float(self.slots),
            "gpu": 0,
            "kinds": [self.kind],  # empty would be every kind: other jobs' tasks too
        }

    async def _check_finished(self) -> None:
        if self._leases or self._reports or self._sending:
            return
        view = await self._call("wait_job", {"job_id": self.job_id, "timeout_s": 0})
        if isinstance(view, dict) and view.get("state") == "cancelled" and not self.cancelled_before:
            self._halt(view)  # cancelled while the run held no lease (starting): no cancel_lease came
            return
        if view is not None and view.get("state") != "running":
            # Done only once the dead letters are known: the engine ends its run as soon as this
            # source is exhausted, and then reads them (it reported none dead while they came).
            for task in await self._call("dead", {"job_id": self.job_id}) or []:
                if str(task.get("task_id")) not in self.dead_before:  # counted with the earlier runs
                    self.dead[str(task.get("task_id"))] = str(task.get("error", ""))
            self._done = True
            log.info(
                "pipeline_job_finished", job_id=self.job_id, state=view.get("state"), dead=len(self.dead)
            )

    async def _flush_reports(self) -> None:
        # All at once: the master journals what arrives together in one transaction (one fsync),
        # where one report after another would cost a commit each.
        while self._reports:
            batch = list(self._reports)
            self._reports.clear()
            self._sending += batch
            async with anyio.create_task_group() as tg:
                for report in batch:
                    tg.start_soon(self._report, report)

    async def _report(self, report: tuple[str, dict[str, Any]]) -> None:
        """Send an item's end until a master answers it, as a worker's getter does: sent once,
        one sent while the master was down was lost, and its item ran again once its lease ran
        out at the master restarted on its journal (report pl 3)."""
        asked = time.monotonic()
        sent: int | None = None

        def before(payload: dict[str, Any]) -> None:
            nonlocal asked, sent
            asked = time.monotonic()
            sent = None if self._registering else self._registrations  # as _call's

        async def forgotten(payload: dict[str, Any]) -> None:
            self._answered()
            await self._register_again(sent, report[0])

        def unanswered(payload: dict[str, Any], exc: TroupeError) -> None:
            self._unanswered(report[0], exc, asked)

        kind, payload = report
        answered = await report_until_answered(
            self.runtime,
            self.master,
            kind,
            payload,
            timeout=max(self.poll_s * 3, 10.0),
            retry_s=_SILENT_RETRY_S,
            forgotten=forgotten,
            ids={"task_id": payload["task_id"], "lease_id": payload["lease_id"]},
            before=before,
            unanswered=unanswered,
        )
        self._sending = [r for r in self._sending if r is not report]  # not if cancelled: release
        if answered is not None:
            self._answered()
            if isinstance(answered[1], dict) and answered[1].get("known") is False:
                await self._register_again(sent, kind)

    async def _renew_loop(self) -> None:
        """Renew every lease held whenever the first is due, a renewal period (a third of its
        TTL) after it came or was last renewed, as a worker's held leases are. A lease that comes
        wakes the loop: timed from before any lease came, the first renewal was a default period
        (20 s) away, past the end of a shorter lease."""
        while True:
            due = min((float(lease[_RENEW_AT]) for lease in self._leases.values()), default=math.inf)
            if (wait := due - time.monotonic()) > 0:
                self._lease_came = anyio.Event()
                with anyio.move_on_after(wait):
                    await self._lease_came.wait()
                continue
            for task_id, lease in list(self._leases.items()):
                _renew_next_after(lease)  # answered or not, the next try is a period away
                ids = {"worker_id": self.worker_id, "task_id": task_id, "lease_id": lease["lease_id"]}
                reply = await self._call("renew", {**ids, "node": self.runtime.node, "pid": os.getpid()})
                if reply and reply.get("outcome") == "renewed":
                    lease["ttl"] = reply.get("ttl", lease.get("ttl"))
                    _renew_next_after(lease)
                elif reply:  # refused: the job may have been cancelled (a missed cancel_lease)
                    self._suspect = True
                    self._kick.set()

    async def release(self) -> None:
        """Tell the master the ends already known, and give back every other lease (``decline``:
        no attempt counted), so that a rerun leases those tasks at once instead of after their
        leases expire (minutes). Each message is sent and not waited for: the run is cancelled,
        and its runtime reads no replies any more."""
        if not self.master_outlives_run:
            return
        messages = [
            *self._reports,
            *self._sending,  # those a master had not answered yet
            *(("decline", self._declined(tid, lease)) for tid, lease in self._leases.items()),
        ]
        self._reports.clear()
        self._sending.clear()
        self._leases.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for kind, payload in messages:
                    tg.start_soon(send_unanswered, self.runtime, self.master, kind, payload)
            # Off the master's list of workers, after its leases went back: a stopped run stayed
            # listed (ctl status) until the job's next run found it gone.
            left = {"worker_id": self.worker_id, "pid": os.getpid(), "reason": "run stopped"}
            await send_unanswered(self.runtime, self.master, "worker_left", left)
        if messages:
            log.info("pipeline_leases_released", job_id=self.job_id, messages=len(messages))

    def _declined(self, task_id: str, lease: dict[str, Any]) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "task_id": task_id,
            "lease_id": lease["lease_id"],
            "reason": "the pipeline run stopped",
            "request": 0,
            "given_back": True,  # the worker may lease the kind again: the next run is another
        }

    async def _call(self, msg_type: str, payload: Any) -> Any:
        asked = time.monotonic()
        sent = None if self._registering else self._registrations  # None: it may pass the one on its way
        try:
            reply = await self.runtime.control(
                self.master, msg_type, payload, timeout=max(self.poll_s * 3, 10.0)
            )
        except UnknownWorker:
            self._answered()
            await self._register_again(sent, msg_type)
            return None
        except (AskTimeout, Unreachable) as exc:
            self._unanswered(msg_type, exc, asked)
            await anyio.sleep(_SILENT_RETRY_S)  # an error that came at once must not spin the loop
            return None
        except TroupeError as exc:
            log.warning("pipeline_source_call_failed", type=msg_type, error=str(exc))
            return None
        self._answered()
        if isinstance(reply, dict) and reply.get("known") is False:
            await self._register_again(sent, msg_type)
        return reply

    async def _register_again(self, sent: int | None, after: str) -> None:
        """The master does not know this run (it restarted): a request answered
        ``unknown_worker``, or a ``renew`` or report answered ``known: false``. The last come
        from a run whose slots are full, which asks for no work, while the master keeps the
        leases it held over for it: it registers again now, as a worker's getter does, so that
        the master knows whose leases they are (``ctl status``, drains).

        ``sent``: the registrations sent again when the call that says so was sent (None: one
        was on its way, which the call may have passed). Only a call sent after the last one
        asks for another, so the run registers once for all of them; a second would cost
        nothing but the call (the master keeps the leases of a process that registers again,
        ``pid``: as the one of a register that timed out here and was answered there)."""
        if sent != self._registrations:
            return
        self._registrations += 1
        self._registering = True
        log.warning(
            "pipeline_source_unknown_worker", hint="the master restarted; registering again", after=after
        )
        try:
            await self.runtime.control(self.master, "register_worker", self._registration(), timeout=10.0)
        except TroupeError as exc:  # the next call answered so, sent from now on, asks again
            log.warning("pipeline_source_call_failed", type="register_worker", error=str(exc))
        finally:
            self._registering = False

    def _unanswered(self, msg_type: str, exc: TroupeError, asked: float) -> None:
        """``asked``: when the call that went unanswered was sent; the silence began by then
        (the master back after a 15 s outage was said to answer again after 5 s)."""
        log.warning("pipeline_source_call_failed", type=msg_type, error=str(exc))
        if self._unanswered_since is not None:
            return
        if isinstance(exc, PeerLost) and not self.master_outlives_run:
            return  # the run's own master stopped (failed): its error ends the run, it comes not back
        self._unanswered_since = asked
        self._tell_people(
            f"the master at {self.master} does not answer ({type(exc).__name__}): the run waits for "
            "it and goes on once it is back (Ctrl-C stops the run; the same command resumes it)"
        )

    def _answered(self) -> None:
        if self._unanswered_since is None:
            return
        silent = time.monotonic() - self._unanswered_since
        self._unanswered_since = None
        self._tell_people(f"the master at {self.master} answers again after {silent:.0f} s; the run goes on")

    def _tell_people(self, line: str) -> None:
        log.info("pipeline_master_link", line=line)
        if self.on_event is not None:
            self.on_event(line)
