"""The workers' controls: ``register_worker``, ``request_task``, ``renew``, the reports
(``complete``, ``fail``, ``decline``) and ``worker_left``, and what the master keeps of each worker.

:class:`WorkerControls` is the part of :class:`~troupe.runtime.tasks.master.master.Master` that
answers its workers (the protocol is in the master's module docstring); each handler decodes its
payload (``controls.py``) and queues its events on the driver; all but ``worker_left`` (which
awaits its event) return an Answer that the router sends once the batch is journaled, with no
task per message (see troupe.runtime.core.router). Decoding errors raise before anything is
queued, and are answered like any handler's. A report
or renewal the book turns away as stale is counted (:meth:`WorkerControls.stale_reports`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from troupe.runtime.core.router import Answer
from troupe.runtime.errors import UnknownWorker
from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.state import (
    Ack,
    Command,
    Complete,
    Decline,
    Fail,
    Reject,
    Renew,
    Resources,
    WorkerJoined,
    WorkerLeft,
)

from .answers import after_all, lease_payloads
from .controls import (
    RegisterWorkerControl,
    RenewControl,
    ReportControl,
    RequestTaskControl,
    WorkerLeftControl,
)
from .operations import raise_rejected
from .result_refs import result_ref_refused

if TYPE_CHECKING:
    from troupe.runtime.tasks.book import TaskBook

    from .driver import Dispatcher
    from .master_config import MasterConfig
    from .operations import Operations

__all__ = ["WorkerControls", "WorkerEntry"]

log = get_logger(__name__)

_STALE_SEEN_MOST = 4096  # the reports remembered as counted (oldest forgotten first)


@dataclass(slots=True)
class WorkerEntry:
    """What the master keeps of a registered worker."""

    node: str
    endpoint: str
    pid: int
    slots: int
    resources: Resources
    kinds: list[str]
    declined: frozenset[str] = frozenset()
    process: str = ""  # its identity (process_identity.py): a rerun on its host checks it
    # Leases sent in replies to its request_task that it has not yet said it holds: one it
    # still does not hold at its next request never reached it (see _return_unseen).
    granted: dict[int, str] = field(default_factory=dict)

    @property
    def signature(self) -> tuple[str, int, Resources, tuple[str, ...], frozenset[str]]:
        # workers alike in all of these are served alike (see the driver's long polls)
        return (self.node, self.slots, self.resources, tuple(self.kinds), self.declined)


class WorkerControls:
    """Answers the workers' controls and keeps the workers registered (a part of the master)."""

    config: MasterConfig
    book: TaskBook
    dispatcher: Dispatcher
    ops: Operations
    clock: Callable[[], float]  # monotonic: the book's lease deadlines are on it
    dispatched: int  # leases granted
    _workers: dict[str, WorkerEntry]  # by worker id, while registered
    _stale: dict[str, int]  # reports and renewals dropped as stale, by kind
    _stale_seen: dict[tuple[str, str, int], None]  # counted already: a report's retries

    def _register_worker(self, payload: Any) -> Answer:
        m = RegisterWorkerControl.decode(payload)
        worker_id, node, slots = m.worker_id, m.node, m.slots
        resources = Resources(m.cpu, m.gpu)
        kinds = sorted(set(m.kinds))
        self.dispatcher.unpark(worker_id)
        joined = self.dispatcher.put(
            WorkerJoined(worker_id, node, resources, slots, frozenset(kinds), m.prefetch, m.pid)
        )

        def registered(reply: list[Command]) -> dict[str, Any]:
            raise_rejected(reply)
            entry = WorkerEntry(node, m.endpoint, m.pid, slots, resources, kinds, process=m.process)
            before = self._workers.get(worker_id)
            if before is not None and before.pid and before.pid == m.pid:  # the same, its leases kept
                entry.declined, entry.granted = before.declined, before.granted
            self._workers[worker_id] = entry
            log.info(
                "worker_joined", worker=worker_id, node=node, slots=slots, gpu=resources.gpu,
                kinds=kinds or "any",
            )  # fmt: skip
            return {"ok": True, "master": self.config.name}

        return Answer(joined, registered)

    def _entry(self, worker_id: str) -> WorkerEntry:
        entry = self._workers.get(worker_id)
        if entry is None:
            raise UnknownWorker(
                f"master {self.config.name} does not know worker {worker_id!r}; "
                "register it first (register_worker)"
            )
        return entry

    def _request_task(self, payload: Any) -> Answer:
        m = RequestTaskControl.decode(payload)
        entry = self._entry(m.worker_id)
        unseen = self._return_unseen(m.worker_id, entry, m.held, m.sync) if m.held is not None else []
        wait_s = min(m.wait_s, self.config.max_wait_s)
        # queued after the returns: the book has the tasks back before it answers the request
        future = self.dispatcher.put_request(m.worker_id, m.free_slots, wait_s, entry.signature)
        track = m.held is not None

        def granted(reply: list[Command]) -> dict[str, Any]:
            raise_rejected(reply)
            leases = lease_payloads(reply, self.clock())
            self.dispatched += len(leases)
            if track:
                entry.granted.update((lease["lease_id"], lease["task_id"]) for lease in leases)
            return {"leases": leases}

        if not unseen:
            return Answer(future, granted)

        def returned(replies: list[list[Command]]) -> dict[str, Any]:
            for ((task_id, lease_id), _), reply in zip(unseen, replies, strict=False):
                if any(isinstance(c, Ack) and str(c.outcome) == "returned" for c in reply):
                    self._count_stale("lease", "unseen", m.worker_id, task_id, lease_id)
            return granted(replies[-1])

        return after_all([*(f for _, f in unseen), future], returned)

    def _return_unseen(
        self, worker_id: str, entry: WorkerEntry, held: frozenset[int], sync: bool = False
    ) -> list[tuple[tuple[str, int], asyncio.Future[list[Command]]]]:
        """Put back the tasks of leases whose reply never reached the worker; return the
        queued returns (their futures say whether each went back).

        A worker asks for tasks one request at a time, and runs what a reply leases it before
        asking again; so a lease granted in reply to an earlier request that it does not hold
        now was never received: the reply was lost or came after the worker gave up waiting
        (a link cut while the request was held). Without this the task would wait for the
        lease to expire, and the worker, its slot taken in the book, would idle as long. The
        task goes back without an attempt counted; a lease the worker ran and reported since
        is ignored by the book.

        With ``sync`` the worker says a reply to one of its reports was lost, with the leases
        its piggybacked request got (the master paused past the report's timeout, say): then
        every lease the book has it hold and ``held`` lacks goes back. Not otherwise: a report's
        reply may be on its way while the worker asks (it sends ``sync`` only with none out).
        """
        lost = {**entry.granted, **self.book.leases_of(worker_id)} if sync else entry.granted
        unseen = []
        for lease_id, task_id in lost.items():
            if lease_id not in held:
                event = Decline(
                    worker_id, task_id, lease_id, "the lease never reached the worker", unseen=True
                )
                unseen.append(((task_id, lease_id), self.dispatcher.put(event)))
        entry.granted.clear()
        return unseen

    def _renew(self, payload: Any) -> Answer:
        m = RenewControl.decode(payload)
        pairs = ((m.task_id, m.lease_id), *m.more)
        # queued back to back: one batch, one journal transaction for all the worker holds
        futures = [
            self.dispatcher.put(Renew(m.worker_id, task_id, lease_id, m.node, m.pid))
            for task_id, lease_id in pairs
        ]

        def renewed(replies: list[list[Command]]) -> dict[str, Any]:
            answers = [
                {"lease_id": lease_id, **self._renewed(m.worker_id, task_id, lease_id, reply)}
                for (task_id, lease_id), reply in zip(pairs, replies, strict=True)
            ]
            first = answers[0]
            del first["lease_id"]
            if m.more:
                first["more"] = answers[1:]
            if m.worker_id not in self._workers:
                # A restarted master renews the leases it held over for a worker it does not
                # know yet (a busy worker renews before it asks): it registers again now.
                first["known"] = False
            return first

        return after_all(futures, renewed)

    def _renewed(self, worker_id: str, task_id: str, lease_id: int, reply: list[Command]) -> dict[str, Any]:
        for command in reply:
            if isinstance(command, Ack) and command.deadline is not None:
                return {"outcome": str(command.outcome), "ttl": command.deadline - self.clock()}
            if isinstance(command, Reject):
                self._count_stale("renew", "rejected", worker_id, task_id, lease_id)
                return {"outcome": "rejected", "reason": command.reason}
        return {"outcome": "rejected", "reason": "no answer from the task book"}

    def _count_stale(self, report: str, outcome: str, worker_id: str, task_id: str, lease_id: int) -> None:
        seen = (report, worker_id, lease_id)
        if seen in self._stale_seen:  # a retry of one counted already (sent again during a cut)
            return
        self._stale_seen[seen] = None
        if len(self._stale_seen) > _STALE_SEEN_MOST:
            del self._stale_seen[next(iter(self._stale_seen))]
        key = f"{report}_{outcome}"
        self._stale[key] = self._stale.get(key, 0) + 1
        log.info("stale_report_dropped", report=report, outcome=outcome, worker=worker_id,
                 task_id=task_id, lease_id=lease_id)  # fmt: skip

    def stale_reports(self) -> dict[str, int]:
        """Reports and renewals dropped as stale, by ``<report>_<outcome>`` (e.g.
        ``complete_duplicate``: a copy cut off from the master finished a task done since)."""
        return dict(self._stale)

    def _complete(self, payload: Any) -> Answer:
        refused = result_ref_refused(payload.get("result_ref")) if type(payload) is dict else None
        if refused is not None:
            return self._refused_complete(payload, refused)
        m = ReportControl.decode("complete", payload)
        event = Complete(m.worker_id, m.task_id, m.lease_id, m.result_ref, m.run_s)
        return self._report(event, m)

    def _refused_complete(self, payload: dict[Any, Any], refused: str) -> Answer:
        """A complete whose result_ref is no reference (``result_ref_refused``) is answered
        rejected and keeps nothing of it: its attempt fails, as the worker's own check of what
        ``run_task`` returned fails it, retried or dead-lettered as any failed attempt."""
        m = ReportControl.decode("complete", {**payload, "result_ref": None})
        error = f"the master refused this attempt's complete report: {refused}"
        log.warning(
            "complete_refused", worker=m.worker_id, task_id=m.task_id, lease_id=m.lease_id, reason=refused
        )
        return self._report(Fail(m.worker_id, m.task_id, m.lease_id, error), m, refused=error)

    def _fail(self, payload: Any) -> Answer:
        m = ReportControl.decode("fail", payload)
        return self._report(Fail(m.worker_id, m.task_id, m.lease_id, m.error, m.traceback), m)

    def _decline(self, payload: Any) -> Answer:
        m = ReportControl.decode("decline", payload)
        event = Decline(m.worker_id, m.task_id, m.lease_id, m.reason, given_back=m.given_back)
        entry = self._workers.get(event.worker_id)
        if entry is not None and m.kind and not m.given_back:  # nor will the book lease it that kind
            entry.declined = entry.declined | {m.kind}
        return self._report(event, m)

    def _report(self, event: Complete | Fail | Decline, m: ReportControl, refused: str = "") -> Answer:
        entry = self._workers.get(event.worker_id)
        if entry is None or m.request <= 0:
            future = self.dispatcher.put(event)
        else:
            # The report and the next request in one entry of one batch: one fsync covers the
            # report and the next lease, and the reply carries both.
            future = self.dispatcher.put_report(event, event.worker_id, m.request)
        known = entry is not None
        return Answer(future, lambda reply: self._reported(event, m, known, reply, refused))

    def _reported(
        self,
        event: Complete | Fail | Decline,
        m: ReportControl,
        known: bool,
        reply: list[Command],
        refused: str,
    ) -> dict[str, Any]:
        """The reply to a report: its outcome, and the leases its piggybacked request got;
        ``refused``: why the report itself was refused (the event stands for its failed attempt)."""
        leases = lease_payloads(reply, self.clock())
        self.dispatched += len(leases)
        out: dict[str, Any] = {"leases": leases, "known": known}
        for command in reply:
            if isinstance(command, Ack):
                out["outcome"] = str(command.outcome)
                if str(command.outcome) == "committed":
                    self.ops.task_done()
            elif isinstance(command, Reject):
                out["outcome"], out["reason"] = "rejected", command.reason
        if refused:  # not stale: logged as refused already
            out["outcome"], out["reason"] = "rejected", refused
        elif out.get("outcome") in ("duplicate", "ignored", "rejected"):
            self._count_stale(m.control, out["outcome"], event.worker_id, event.task_id, event.lease_id)
        return out

    async def _worker_left(self, payload: Any) -> bool:
        m = WorkerLeftControl.decode(payload)
        worker_id, pid = m.worker_id, m.pid
        entry = self._workers.get(worker_id)
        if entry is None:
            # Not registered, yet it may hold leases a restart held over (it named them before
            # it registered again): they go back now, not when they expire; unless the pid
            # its renew said is another (the book compares, refusing a stale one).
            if not self.book.leases_of(worker_id):
                return False
            reply = await self.dispatcher.handle(WorkerLeft(worker_id, m.reason, pid))
            refused = next((c.reason for c in reply if isinstance(c, Reject)), None)
            if refused is not None:
                self._worker_left_stale(worker_id, pid, refused)
                return False
            log.info("worker_left_master", worker=worker_id, reason=m.reason, registered=False)
            return True
        if pid and entry.pid and pid != entry.pid:  # a newer incarnation registered already
            self._worker_left_stale(worker_id, pid, f"pid {entry.pid} registered since")
            return False
        del self._workers[worker_id]
        self.dispatcher.unpark(worker_id)
        await self.dispatcher.handle(WorkerLeft(worker_id, m.reason))
        log.info("worker_left_master", worker=worker_id, reason=m.reason)
        return True

    def _worker_left_stale(self, worker_id: str, pid: int, why: str) -> None:
        self._stale["worker_left_stale"] = self._stale.get("worker_left_stale", 0) + 1
        log.info("stale_report_dropped", report="worker_left", worker=worker_id, pid=pid, why=why)

    def workers(self) -> dict[str, dict[str, Any]]:
        """Return the registered workers as plain data (node, endpoint, slots, kinds)."""
        return {
            w: {
                "node": e.node,
                "endpoint": e.endpoint,
                "slots": e.slots,
                "cpu": e.resources.cpu,
                "gpu": e.resources.gpu,
                "kinds": e.kinds,
                "process": e.process,
            }
            for w, e in self._workers.items()
        }
