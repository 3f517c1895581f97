"""The moves every transition of the task book makes, and the clocks' queues they keep.

:class:`BookMoves` sits between the tables (:class:`~troupe.runtime.tasks.task_tables.TaskTables`)
and the transitions (:class:`~troupe.runtime.tasks.book.TaskBook` and its parts): a copy lost
(an attempt counted when it was the last copy running), a task back to pending, a lease
dropped or moved to another holder, a job finished, and the records and commands they say it
with. The lease expiries and the backoffs wait in heaps here, on the monotonic clock. The rules
are told in :mod:`troupe.runtime.tasks.book`.
"""

from __future__ import annotations

import heapq

from troupe.runtime.library_logging import get_logger

from .book_rows import Job, LeaseSlot, Task, Worker
from .state import (
    CancelLease,
    Command,
    Event,
    JobFinished,
    JobRecord,
    JobState,
    Record,
    Reject,
    TaskRecord,
    TaskState,
)
from .task_tables import TaskTables

__all__ = ["BookMoves"]

log = get_logger(__name__)

PENDING, LEASED, FAILED = TaskState.PENDING, TaskState.LEASED, TaskState.FAILED
DEAD = TaskState.DEAD


class BookMoves(TaskTables):
    """The tables, with the moves the book's transitions share (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._drain_waiting: set[str] = set()  # draining nodes not yet reported drained
        self._expiry: list[tuple[float, int]] = []  # (deadline, lease id); stale once renewed
        # (due on the monotonic clock, seq, task id, its not_before on the wall clock)
        self._backoff: list[tuple[float, int, str, float]] = []

    def _copy_lost(
        self,
        task: Task,
        now: float,
        error: str,
        traceback: str,
        out: list[Command],
        failed_at: float | None = None,
    ) -> None:
        """A copy ended without a result; count the attempt if no other copy still runs.

        ``failed_at``: the wall time of a failure the task reported (it then backs off, and its
        ``not_before`` is journaled on the wall clock); None for a copy lost otherwise (an
        expired lease, a worker gone), which goes back to pending at once.
        """
        if task.copies or task.state is not LEASED:
            return
        task.attempts += 1
        task.error, task.traceback = error, traceback
        policy = task.job.policy
        if task.attempts >= policy.max_attempts:
            self._set_state(task, DEAD)
            out.append(self._record(task))
            log.warning("task_dead_lettered", task_id=task.spec.task_id, attempts=task.attempts, error=error)
            self._maybe_finish(task.job, out)
        elif failed_at is not None and policy.backoff(task.attempts) > 0:
            wait_s = policy.backoff(task.attempts)
            task.not_before = failed_at + wait_s
            self._set_state(task, FAILED)
            heapq.heappush(self._backoff, (now + wait_s, task.seq, task.spec.task_id, task.not_before))
            out.append(self._record(task))
        else:
            self._enqueue(task)
            out.append(self._record(task))

    def _enqueue(self, task: Task) -> None:
        self._set_state(task, PENDING)
        task.job.queue.push(task)

    def _drop_lease(self, lease: LeaseSlot) -> None:
        del lease.task.copies[lease.lease_id]
        del self._leases[lease.lease_id]
        worker = lease.worker
        worker.release(lease)
        if not worker.leases and self._unregistered.get(worker.worker_id) is worker:
            del self._unregistered[worker.worker_id]

    def _move_lease(self, lease: LeaseSlot, worker: Worker) -> None:
        lease.worker.release(lease)
        lease.worker = worker
        worker.hold(lease)

    def _maybe_finish(self, job: Job, out: list[Command]) -> None:
        c = job.counts
        if job.state is JobState.RUNNING and not (c[PENDING] or c[LEASED] or c[FAILED]):
            self._finish(job, JobState.FAILED if c[DEAD] else JobState.DONE, out)

    def _finish(self, job: Job, state: JobState, out: list[Command]) -> None:
        job.state = state
        self._running.remove(job)
        out.append(Record(self._job_record(job)))
        out.append(JobFinished(job.job_id, state))
        log.info("job_finished", job_id=job.job_id, state=str(state), dead=job.counts[DEAD])

    @staticmethod
    def _job_record(job: Job) -> JobRecord:
        return JobRecord(job.job_id, job.name, job.seq, job.state, job.policy, job.submitted_at)

    @staticmethod
    def _record(task: Task) -> Record:
        return Record(
            TaskRecord(
                task.spec.task_id,
                task.job.job_id,
                task.state,
                task.attempts,
                task.not_before,
                task.last_lease_id,
                task.result_ref,
                task.error,
                task.traceback,
            )
        )

    @staticmethod
    def _cancel_lease(lease: LeaseSlot, reason: str) -> CancelLease:
        return CancelLease(lease.worker.worker_id, lease.task.spec.task_id, lease.lease_id, reason)

    @staticmethod
    def _reject(event: Event, reason: str, out: list[Command]) -> None:
        out.append(Reject(event, reason))
        log.info("event_rejected", event_type=type(event).__name__, reason=reason)
