"""What the workers say of their leases: Renew, Complete, Decline and Fail.

:class:`WorkerReports` checks each against the lease it names (a lease held over a restart is
claimed by it), and settles it: a renewed deadline, the commit of a task (from a lease since
ended too, a dead letter overturned), a task given back without an attempt, or a failed attempt
that backs off. The rules are told in :mod:`troupe.runtime.tasks.book`.
"""

from __future__ import annotations

import heapq

from troupe.runtime.library_logging import get_logger

from .book_held_over import HeldOverLeases
from .book_rows import LeaseSlot, Task
from .state import (
    FINAL_STATES,
    Ack,
    AckOutcome,
    Command,
    Complete,
    Decline,
    Fail,
    JobFinished,
    JobState,
    Record,
    Renew,
    TaskState,
)

__all__ = ["WorkerReports"]

log = get_logger(__name__)

LEASED, DONE, DEAD = TaskState.LEASED, TaskState.DONE, TaskState.DEAD


class WorkerReports(HeldOverLeases):
    """The workers' reports on their leases (see the module docstring)."""

    def _renew(self, ev: Renew, now: float, out: list[Command]) -> None:
        lease = self._leases.get(ev.lease_id)
        if lease is None or lease.task.spec.task_id != ev.task_id:
            return self._reject(
                ev,
                f"lease {ev.lease_id} of task {ev.task_id!r} is no longer "
                "valid (expired, requeued or finished); drop the task",
                out,
            )
        if lease.worker is self._unclaimed:
            self._claim(lease, ev.worker_id, ev.node_id, ev.pid)
        elif lease.worker.worker_id != ev.worker_id:
            return self._reject(
                ev,
                f"lease {ev.lease_id} belongs to worker {lease.worker.worker_id!r}, not {ev.worker_id!r}",
                out,
            )
        lease.deadline = now + lease.task.job.policy.lease_s
        heapq.heappush(self._expiry, (lease.deadline, lease.lease_id))
        out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.RENEWED, lease.deadline))

    def _check_report(
        self, ev: Complete | Fail | Decline, out: list[Command]
    ) -> tuple[Task, LeaseSlot | None] | None:
        """Checks common to the reports; None when they answered the event already."""
        task = self._tasks.get(ev.task_id)
        if task is None:
            self._reject(ev, f"unknown task {ev.task_id!r}", out)
            return None
        if task.state is DEAD and isinstance(ev, Complete) and 1 <= ev.lease_id <= task.last_lease_id:
            return task, None  # its output is committed: the dead letter is overturned
        if task.state in FINAL_STATES:
            outcome = AckOutcome.DUPLICATE if task.state is DONE else AckOutcome.IGNORED
            out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, outcome))
            return None
        lease = task.copies.get(ev.lease_id)
        if lease is not None and lease.worker is self._unclaimed:
            self._claim(lease, ev.worker_id)
        if lease is None and not 1 <= ev.lease_id <= task.last_lease_id:
            self._reject(ev, f"lease {ev.lease_id} was never issued for task {ev.task_id!r}", out)
            return None
        if lease is not None and lease.worker.worker_id != ev.worker_id:
            self._reject(
                ev,
                f"lease {ev.lease_id} belongs to worker {lease.worker.worker_id!r}, not {ev.worker_id!r}",
                out,
            )
            return None
        return task, lease

    def _complete(self, ev: Complete, now: float, out: list[Command]) -> None:
        checked = self._check_report(ev, out)
        if checked is None:
            return
        task, winner = checked
        if task.state is DEAD:
            return self._overturn(task, ev, out)
        if winner is None:
            log.info("late_complete_accepted", task_id=ev.task_id, lease_id=ev.lease_id)
        else:
            # the copy's own run time: a lease ahead waited for a slot before it ran
            task.job.durations.add(now - winner.start if ev.run_s is None else ev.run_s)
            self._spec_won += winner.backup
        for lease in list(task.copies.values()):
            self._drop_lease(lease)
            if lease is not winner and lease.worker is not self._unclaimed:
                out.append(self._cancel_lease(lease, "another copy of the task finished first"))
        task.result_ref = ev.result_ref
        self._set_state(task, DONE)
        out.append(self._record(task))
        out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.COMMITTED))
        self._maybe_finish(task.job, out)

    def _overturn(self, task: Task, ev: Complete, out: list[Command]) -> None:
        """A dead-lettered task's copy committed after all: the task is done."""
        job = task.job
        task.result_ref = ev.result_ref
        self._set_state(task, DONE)
        out.append(self._record(task))
        out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.COMMITTED))
        log.warning("dead_letter_overturned", task_id=ev.task_id, lease_id=ev.lease_id, job_id=job.job_id)
        if job.state is JobState.FAILED and not job.counts[DEAD]:
            job.state = JobState.DONE  # it is no longer among the running: nothing to remove
            out.append(Record(self._job_record(job)))
            out.append(JobFinished(job.job_id, JobState.DONE))
            log.info("job_finished", job_id=job.job_id, state="done", overturned=True)
        else:
            self._maybe_finish(job, out)

    def _decline(self, ev: Decline, out: list[Command]) -> None:
        checked = self._check_report(ev, out)
        if checked is None:
            return
        task, lease = checked
        if lease is None:
            out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.IGNORED))
            return
        self._drop_lease(lease)
        if not (ev.unseen or ev.given_back):
            lease.worker.declined.add(task.spec.kind)
        if not task.copies and task.state is LEASED:
            self._enqueue(task)
            out.append(self._record(task))
        out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.RETURNED))
        # A prefetched lease given back is a lease ahead working as meant (it waited too long
        # in its worker for a slot): info, not the warning an unseen lease or a decline is.
        emit = log.info if ev.given_back and not ev.unseen else log.warning
        emit(
            "lease_unseen_returned"
            if ev.unseen
            else "prefetched_lease_given_back"
            if ev.given_back
            else "task_declined",
            task_id=ev.task_id,
            worker=ev.worker_id,
            kind=task.spec.kind,
            reason=ev.reason,
        )

    def _fail(self, ev: Fail, now: float, wall: float, out: list[Command]) -> None:
        checked = self._check_report(ev, out)
        if checked is None:
            return
        task, lease = checked
        if lease is None:  # that copy's attempt was settled when its lease ended
            out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.IGNORED))
            return
        self._drop_lease(lease)
        self._copy_lost(task, now, ev.error, ev.traceback, out, wall)
        out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.RECORDED))
