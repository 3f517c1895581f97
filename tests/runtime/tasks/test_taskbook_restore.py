"""A restart's book: tasks never leased are taken back as a whole, the others one by one, and
the queue comes out in submit order either way."""

from __future__ import annotations

from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.state import (
    JobPolicy,
    JobRecord,
    JobState,
    Lease,
    RequestTask,
    Resources,
    TaskRecord,
    TaskSpec,
    TaskState,
    WorkerJoined,
)

P, D = TaskState.PENDING, TaskState.DONE


def row(
    task_id: str, job_id: str, state: TaskState = P, attempts: int = 0, lease: int = 0
) -> tuple[TaskSpec, TaskRecord]:
    return TaskSpec(task_id, "k", 0), TaskRecord(
        task_id, job_id, state, attempts, 0.0, lease, None, None, None
    )


def test_untouched_and_touched_rows_restore_in_submit_order() -> None:
    jobs = [
        JobRecord("a", "a", 0, JobState.RUNNING, JobPolicy(), 0.0),
        JobRecord("b", "b", 1, JobState.RUNNING, JobPolicy(), 0.0),
        JobRecord("c", "c", 2, JobState.CANCELLED, JobPolicy(), 0.0),
    ]
    rows = [
        row("a0", "a"),
        row("a1", "a"),
        row("b0", "b"),
        row("a2", "a", TaskState.FAILED, attempts=1, lease=3),  # backing off: pending again
        row("a3", "a"),
        row("b1", "b", D, attempts=1, lease=2),
        row("c0", "c"),  # never leased, of a cancelled job: cancelled
        row("a4", "a", TaskState.LEASED, attempts=0, lease=7),  # its lease is void now
    ]
    book = TaskBook.restore(jobs, rows)
    stats = book.statistics()
    assert {s: n for s, n in stats.tasks.items() if n} == {P: 6, D: 1, TaskState.CANCELLED: 1}
    assert (book.task("a2").attempts, book.task("b1").state) == (1, D)
    book.handle(WorkerJoined("w", "n", Resources(10, 0), 10), 1.0)
    granted = [c for c in book.handle(RequestTask("w", 10), 1.0) if isinstance(c, Lease)]
    assert [g.task_id for g in granted] == ["a0", "a1", "a2", "a3", "a4", "b0"]
    assert min(g.lease_id for g in granted) > 7  # lease ids go on above every one journaled
