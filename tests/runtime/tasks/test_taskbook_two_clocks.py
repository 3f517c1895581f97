"""The task book's two clocks: ``now`` (monotonic) measures leases and backoffs, ``wall`` is
only journaled or shown as a time, so a step of the wall clock between two events changes no
duration."""

from __future__ import annotations

from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.state import (
    CancelLease,
    Command,
    Fail,
    JobPolicy,
    JobSubmitted,
    Lease,
    Record,
    RequestTask,
    Resources,
    SchedulerTick,
    SubmitJob,
    TaskRecord,
    TaskSpec,
    TaskState,
    WorkerJoined,
)

WALL = 1_800_000_000.0
HOUR = 3600.0


def booked(policy: JobPolicy) -> tuple[TaskBook, Lease]:
    """A book whose one task is leased at monotonic 10.0, wall ``WALL``."""
    book = TaskBook()
    out = book.handle(SubmitJob("j", [TaskSpec("t", "k", 0)], policy), 10.0, WALL)
    [submitted] = [c.entry for c in out if isinstance(c, Record) and isinstance(c.entry, JobSubmitted)]
    assert submitted.job.submitted_at == WALL  # journaled: the wall clock's
    book.handle(WorkerJoined("w", "n", Resources(1, 0), 1), 10.0, WALL)
    [lease] = [c for c in book.handle(RequestTask("w", 1), 10.0, WALL) if isinstance(c, Lease)]
    assert lease.deadline == 10.0 + policy.lease_s  # on the monotonic clock
    return book, lease


def cancelled(out: list[Command]) -> list[CancelLease]:
    return [c for c in out if isinstance(c, CancelLease)]


def test_a_wall_step_either_way_neither_expires_a_lease_nor_keeps_one() -> None:
    book, lease = booked(JobPolicy(lease_s=60.0))
    assert cancelled(book.handle(SchedulerTick(), 11.0, WALL + HOUR)) == []
    assert cancelled(book.handle(SchedulerTick(), 69.9, WALL - HOUR)) == []
    expired = cancelled(book.handle(SchedulerTick(), 70.0, WALL - HOUR))
    assert [c.lease_id for c in expired] == [lease.lease_id]


def test_a_backoff_waits_its_seconds_whatever_the_wall_clock_does() -> None:
    book, lease = booked(JobPolicy(backoff_base_s=5.0, max_attempts=3))
    out = book.handle(Fail("w", "t", lease.lease_id, "boom", ""), 12.0, WALL + 2)
    [row] = [c.entry for c in out if isinstance(c, Record) and isinstance(c.entry, TaskRecord)]
    assert (row.state, row.not_before) == (TaskState.FAILED, WALL + 7)  # journaled as a wall time
    assert book.handle(SchedulerTick(), 16.9, WALL - HOUR) == []
    [again] = [c.entry for c in book.handle(SchedulerTick(), 17.0, WALL - HOUR) if isinstance(c, Record)]
    assert isinstance(again, TaskRecord) and again.state is TaskState.PENDING
