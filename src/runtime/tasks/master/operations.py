"""The master's operator side: jobs in and out, and what ``troupe ctl`` shows.

:class:`Operations` answers the operators' control messages (``submit``, ``jobs``, ``cancel``,
``retry_dead``, ``drain``, ``undrain``, ``dead``, ``done_tasks``, ``wait_job``, ``status``) for a
:class:`~troupe.runtime.tasks.master.master.Master`, and keeps what the book does not: when
each job was submitted to this master and when it finished (for makespans and rates), and the
done tasks of the last few seconds (throughput).
Those are in memory only; after a restart they start afresh. Times come from the master's
clocks: its ``wall_clock`` for the submit and finish times it shows, its monotonic ``clock``
for throughput and a job's rate (a step of the wall clock must not make a rate negative).
Payloads are decoded by :mod:`troupe.runtime.tasks.master.controls`.

A submit is idempotent: the same job id with the same content (tasks, policy, name) answers
``already: true`` with the job as it is, so a client whose reply was lost (a slow write of a
very large job) can simply submit again; the same id with other content is refused.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import psutil

from troupe.runtime.errors import TaskError, TroupeError
from troupe.runtime.security.process import security_status
from troupe.runtime.start_limits import in_thread
from troupe.runtime.tasks.jobspec import parse_job
from troupe.runtime.tasks.state import (
    CancelJob,
    Command,
    DrainNode,
    JobState,
    JobSummary,
    Reject,
    RetryDead,
    SubmitJob,
    TaskState,
    UndrainNode,
)

from .controls import (
    CancelControl,
    DeadControl,
    DoneTasksControl,
    NodeControl,
    RetryDeadControl,
    SubmitControl,
    WaitJobControl,
)
from .job_listing import STATUS_FINISHED_JOBS, decode_jobs_last, recent_jobs
from .journal_room import check_room
from .undrain import tell_undrained

if TYPE_CHECKING:
    from collections.abc import Callable

    from troupe.runtime.core.runtime import ControlHandler, Runtime
    from troupe.runtime.gc_pauses import GcPauses
    from troupe.runtime.tasks.book import TaskBook
    from troupe.runtime.tasks.journal import Journal

    from .driver import Dispatcher
    from .master_config import MasterConfig
    from .nodes import NodeTable

__all__ = ["MAX_JOB_WAITERS", "OperatedMaster", "Operations", "raise_rejected"]

MAX_JOB_WAITERS = 1024
"""``wait_job`` controls that may wait at once; more are answered at once (see ``_wait_job``)."""


def raise_rejected(reply: list[Command]) -> None:
    """Raise the book's refusal, if the reply holds one.

    Raises:
        TaskError: with the book's reason (which says what to do).
    """
    for command in reply:
        if isinstance(command, Reject):
            raise TaskError(command.reason)


class OperatedMaster(Protocol):
    """What the operator side uses of the master (``Master``): its config, clocks, book,
    driver, node table, journal, runtime, collector pauses, log stream's endpoint and code, and the
    registered workers. Read only: every change goes through the driver (``dispatcher.handle``),
    but the undrains the node table keeps (``NodeTable.undrain_sent``, ``owe_undrain``)."""

    @property
    def config(self) -> MasterConfig: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def wall_clock(self) -> Callable[[], float]: ...

    @property
    def book(self) -> TaskBook: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def nodes(self) -> NodeTable: ...

    @property
    def journal(self) -> Journal: ...

    @property
    def runtime(self) -> Runtime | None: ...

    @property
    def gc(self) -> GcPauses: ...

    @property
    def log_endpoint(self) -> str | None: ...

    @property
    def code(self) -> str: ...

    def workers(self) -> dict[str, dict[str, Any]]: ...

    def stale_reports(self) -> dict[str, int]: ...


class _JobTimes:
    """When a job was submitted to this master and when it finished: on the wall clock (shown)
    and on the monotonic clock (its rate; a finished job's ``finished_mono`` is set)."""

    __slots__ = ("finished", "finished_mono", "started", "started_mono")

    def __init__(self, started: float | None = None, started_mono: float | None = None) -> None:
        self.started, self.started_mono = started, started_mono
        self.finished: float | None = None
        self.finished_mono: float | None = None

    @classmethod
    def now(cls, master: OperatedMaster) -> _JobTimes:
        """Submitted now."""
        return cls(master.wall_clock(), master.clock())


class Operations:
    """Operator commands and read-outs of one master.

    Args:
        master: the master they act on.
    """

    def __init__(self, master: OperatedMaster) -> None:
        self.master = master
        self._times: dict[str, _JobTimes] = {}  # by job id, since it was submitted to this master
        self._finished: dict[str, anyio.Event] = {}
        self._waiting = 0  # wait_job controls waiting now
        self._done: deque[float] = deque()
        self._done_total = 0
        self._started_at = master.clock()

    def handlers(self) -> dict[str, ControlHandler]:
        """Return the control handlers, by message type."""
        return {
            "submit": self._submit,
            "status": self._status,
            "jobs": self._jobs,
            "cancel": self._cancel,
            "retry_dead": self._retry_dead,
            "drain": self._drain,
            "undrain": self._undrain,
            "dead": self._dead,
            "done_tasks": self._done_tasks,
            "wait_job": self._wait_job,
        }

    # ------------------------------------------------------------------ bookkeeping

    def job_finished(self, job_id: str) -> None:
        """Note that a job ended (the book's JobFinished)."""
        times = self._times.setdefault(job_id, _JobTimes())
        times.finished, times.finished_mono = self.master.wall_clock(), self.master.clock()
        self._finished.setdefault(job_id, anyio.Event()).set()

    def task_done(self) -> None:
        """Count one task made done (for throughput)."""
        now = self.master.clock()
        self._done.append(now)
        self._done_total += 1
        self._trim(now)

    def done_per_s(self) -> float:
        """Done tasks per second over the throughput window (shorter right after start)."""
        now = self.master.clock()
        self._trim(now)
        span = min(self.master.config.throughput_window_s, now - self._started_at)
        return len(self._done) / span if span > 0 else 0.0

    def _trim(self, now: float) -> None:
        horizon = now - self.master.config.throughput_window_s
        while self._done and self._done[0] < horizon:
            self._done.popleft()

    def job_view(self, job: JobSummary) -> dict[str, Any]:
        """Return one job as plain data: state, counts by state, timing."""
        times = self._times.get(job.job_id) or _JobTimes()
        started, finished = times.started, times.finished
        counts = {str(state): n for state, n in job.counts.items()}
        span = None
        if times.started_mono is not None:
            end = self.master.clock() if times.finished_mono is None else times.finished_mono
            span = end - times.started_mono
        return {
            "job_id": job.job_id,
            "name": job.name,
            "state": str(job.state),
            "priority": job.priority,
            "total": job.total,
            "counts": counts,
            "submitted_at": job.submitted_at,
            "started_at": started,
            "finished_at": finished,
            "done_per_s": round(counts.get("done", 0) / span, 3) if span else None,
            "refs": dict(job.refs),
            "waiting": [
                {
                    "kind": w.kind,
                    "needs": {"cpu": w.needs.cpu, "gpu": w.needs.gpu},
                    "tasks": w.tasks,
                    "reason": w.reason,
                }
                for w in job.waiting
            ],
        }

    # ------------------------------------------------------------------ control messages

    async def _submit(self, payload: Any) -> dict[str, Any]:
        m = SubmitControl.decode(payload)
        # A job of millions of tasks takes seconds to check: keep serving workers meanwhile.
        event = await in_thread(_submit_event, m.job, m.source, m.job_id, what="submit_parse")
        if not self.master.book.same_job(event.job_id, event.tasks, event.policy, event.name):
            # A write the disk cannot hold stops the master; counted off its loop, as the parse.
            await in_thread(
                check_room, self.master.journal.path, event.job_id, event.tasks, what="journal_room"
            )
        reply = await self.master.dispatcher.handle(event)
        if any(isinstance(c, Reject) for c in reply) and self.master.book.same_job(
            event.job_id, event.tasks, event.policy, event.name
        ):
            # a repeat of a submit that got through (its reply was lost, or it timed out)
            state = str(self._summary(event.job_id).state)
            return {"job_id": event.job_id, "tasks": len(event.tasks), "already": True, "state": state}
        raise_rejected(reply)
        self._times[event.job_id] = _JobTimes.now(self.master)
        return {"job_id": event.job_id, "tasks": len(event.tasks), "already": False, "state": None}

    async def _jobs(self, payload: Any) -> list[dict[str, Any]]:
        """Every job; with ``last``, the running ones and the ``last`` finished (job_listing.py)."""
        last, jobs = decode_jobs_last(payload), self.master.book.jobs()
        if last is not None:
            jobs, _ = recent_jobs(jobs, _running, last)
        return [self.job_view(j) for j in jobs]

    async def _cancel(self, payload: Any) -> dict[str, Any]:
        job_id = CancelControl.decode(payload).job_id
        raise_rejected(await self.master.dispatcher.handle(CancelJob(job_id)))
        return {"job_id": job_id, "cancelled": True}

    async def _retry_dead(self, payload: Any) -> dict[str, Any]:
        """The job's dead tasks run again; ``retried``: how many (0: it had none)."""
        job_id = RetryDeadControl.decode(payload).job_id
        dead = self._summary(job_id).counts.get(TaskState.DEAD, 0)
        raise_rejected(await self.master.dispatcher.handle(RetryDead(job_id)))
        retried = dead - self._summary(job_id).counts.get(TaskState.DEAD, 0)
        if retried:  # it runs again: a wait_job waits for its new end, its makespan starts anew
            self._finished.pop(job_id, None)
            self._times[job_id] = _JobTimes.now(self.master)
        return {"job_id": job_id, "retried": retried, "state": str(self._summary(job_id).state)}

    def _known_node(self, control: str, payload: Any) -> str:
        master, node = self.master, NodeControl.decode(control, payload).node
        known = master.nodes.endpoint(node) is not None or any(
            w["node"] == node for w in master.workers().values()
        )
        if not known:
            raise TaskError(
                f"no node {node!r} has joined master {master.config.name}; see "
                "`troupe ctl status` for the nodes"
            )
        return node

    async def _drain(self, payload: Any) -> dict[str, Any]:
        node = self._known_node("drain", payload)
        await self.master.dispatcher.handle(DrainNode(node))
        return {"node": node, "draining": True}

    async def _undrain(self, payload: Any) -> dict[str, Any]:
        """End a drain: the book leases to the node again, and the node starts again the
        workers the drain stopped (``master_undrained``); they join and pull as at start.
        ``state``: how the master has the node (``alive``, ``stopped``, ``dead``); one not
        alive, or that did not answer (``not_told``: why), is told at its next beat (undrain.py)."""
        master, node = self.master, self._known_node("undrain", payload)
        await master.dispatcher.handle(UndrainNode(node))
        info = next((n for n in master.nodes.nodes() if n.node == node), None)
        state = "alive" if info is None or info.alive else "stopped" if info.left else "dead"
        reply: dict[str, Any] = {"node": node, "draining": False, "restarted": [], "state": state}
        runtime = master.runtime
        if info is None or runtime is None:  # known by its workers alone: it never beat
            return reply
        if not info.alive:
            master.nodes.owe_undrain(node)
            return reply
        try:
            reply["restarted"] = await tell_undrained(runtime, master.nodes, node, info.endpoint)
        except TroupeError as exc:  # the undrain holds in the book: the node's next beat is told
            reply["not_told"] = str(exc)
        return reply

    async def _dead(self, payload: Any) -> list[dict[str, Any]]:
        job_id = DeadControl.decode(payload).job_id
        return [asdict(d) for d in self.master.book.dead_letters(job_id)]

    async def _done_tasks(self, payload: Any) -> dict[str, str]:
        """Which of the given tasks are done, each with its result ref: a run that finds one's
        output missing makes it again (a committed output is the truth, not the book)."""
        m = DoneTasksControl.decode(payload)
        return self.master.book.done_results(m.job_id, m.task_ids)

    async def _wait_job(self, payload: Any) -> dict[str, Any]:
        """The job's view once it is final, or when ``timeout_s`` ends. Past ``MAX_JOB_WAITERS``
        waits at once, a wait is answered at once, the job still running: a peer that sent
        tens of thousands of long waits and left held the master's memory until the job ended
        (a waiter cannot tell that its asker is gone)."""
        m = WaitJobControl.decode(payload)
        job_id = m.job_id
        summary = self._summary(job_id)
        if str(summary.state) == "running" and self._waiting < MAX_JOB_WAITERS:
            event = self._finished.setdefault(job_id, anyio.Event())
            self._waiting += 1
            try:
                with anyio.move_on_after(m.timeout_s):
                    await event.wait()
            finally:
                self._waiting -= 1
            summary = self._summary(job_id)
        return self.job_view(summary)

    def _summary(self, job_id: str) -> JobSummary:
        for job in self.master.book.jobs():
            if job.job_id == job_id:
                return job
        raise TaskError(f"unknown job {job_id!r}; see `troupe ctl jobs`")

    async def _status(self, _: Any) -> dict[str, Any]:
        master = self.master
        stats = master.book.statistics()
        now = master.clock()
        registered = master.workers()
        workers = []
        for worker_id, load in stats.workers.items():
            info = registered.get(worker_id, {})
            workers.append(
                {
                    "worker_id": worker_id,
                    "node": load.node_id,
                    "slots": load.slots,
                    "used": load.used,
                    "draining": load.draining,
                    "kinds": info.get("kinds", []),
                    "gpu": info.get("gpu", 0),
                    "endpoint": info.get("endpoint", ""),
                    "process": info.get("process", ""),  # process_identity.py: "" if not said
                }
            )
        per_node: dict[str, int] = {}
        for w in workers:
            per_node[w["node"]] = per_node.get(w["node"], 0) + 1
        draining = master.book.draining_nodes()
        shown, not_shown = recent_jobs(master.book.jobs(), _running, STATUS_FINISHED_JOBS)
        nodes = [
            {
                "node": n.node,
                "endpoint": n.endpoint,
                "log_endpoint": n.log_endpoint,
                "alive": n.alive,
                "left": n.left,  # not alive because it said it stops (a planned stop), not dead
                "draining": n.node in draining,  # takes no new task, nor a pipeline's new replica
                # Its running workers, a pipeline's replicas among them; None once it is not alive:
                # its last beat's list is out of date (the table says "-").
                "processes": len(n.processes) if n.alive else None,
                "last_beat_age_s": round(now - n.last_beat, 3),
                "workers": per_node.get(n.node, 0),
                "resources": n.resources,
                "tags": list(n.tags),
                "code": n.code or None,  # the troupe code it runs (code_identity.py); None: an older node
                "revivals": n.revivals,
            }
            for n in master.nodes.nodes()
        ]
        runtime = master.runtime
        return {
            "master": master.config.name,
            "endpoint": runtime.address if runtime is not None else master.config.endpoint,
            "pid": os.getpid(),
            "rss_mib": round(psutil.Process().memory_info().rss / 2**20, 1),
            "gc": master.gc.figures(),
            "journal": str(master.journal.path),
            "log_endpoint": master.log_endpoint,  # its own log stream (``logs tail``); None: none
            "code": master.code or None,  # the troupe code it runs (code_identity.py); None: not read yet
            "nodes": nodes,
            "workers": workers,
            "tasks": {str(state): n for state, n in stats.tasks.items()},
            "leases_outstanding": stats.leases_outstanding,
            "speculative": {"launched": stats.speculative_launched, "won": stats.speculative_won},
            "throughput": {
                "done_per_s": round(self.done_per_s(), 3),
                "window_s": master.config.throughput_window_s,
                "done_since_start": self._done_total,
            },
            # Not every job ever given: the reply would grow for good (job_listing.py).
            "jobs": [self.job_view(j) for j in shown],
            "jobs_not_shown": not_shown,
            "driver": asdict(master.dispatcher.statistics()),
            "stale_reports": master.stale_reports(),
            "security": security_status(master.config.insecure),
        }


def _running(job: JobSummary) -> bool:
    return job.state is JobState.RUNNING


def _submit_event(job: dict[str, Any], source: str, job_id: str | None) -> SubmitJob:
    return parse_job(job, source).submit(job_id)
