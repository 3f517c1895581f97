"""A restart's book: tasks never leased are taken back as a whole, the others one by one, and
the queue comes out in submit order either way; a backoff goes on for what remained of it."""

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

P, D, F = TaskState.PENDING, TaskState.DONE, TaskState.FAILED


def row(
    task_id: str,
    job_id: str,
    state: TaskState = P,
    attempts: int = 0,
    lease: int = 0,
    not_before: float = 0.0,
) -> tuple[TaskSpec, TaskRecord]:
    return TaskSpec(task_id, "k", 0), TaskRecord(
        task_id, job_id, state, attempts, not_before, lease, None, None, None
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
        row("a2", "a", TaskState.FAILED, attempts=1, lease=3),  # its backoff over: pending soon
        row("a3", "a"),
        row("b1", "b", D, attempts=1, lease=2),
        row("c0", "c"),  # never leased, of a cancelled job: cancelled
        row("a4", "a", TaskState.LEASED, attempts=0, lease=7),  # held over for its holder
    ]
    book = TaskBook.restore(jobs, rows)
    stats = book.statistics()
    assert {s: n for s, n in stats.tasks.items() if n} == {
        P: 4,
        F: 1,
        D: 1,
        TaskState.CANCELLED: 1,
        TaskState.LEASED: 1,
    }
    assert (book.task("a2").attempts, book.task("b1").state) == (1, D)
    book.handle(WorkerJoined("w", "n", Resources(10, 0), 10), 1.0)
    granted = [c for c in book.handle(RequestTask("w", 10), 1.0) if isinstance(c, Lease)]
    assert [g.task_id for g in granted] == ["a0", "a1", "a2", "a3", "b0"]
    assert min(g.lease_id for g in granted) > 7  # lease ids go on above every one journaled


def test_a_restored_backoff_keeps_what_remained_of_it_at_most_its_own_length() -> None:
    """A backoff's ``not_before`` is journaled on the wall clock; the restarted book's first
    event puts it on its monotonic clock (which starts elsewhere in a new process): what
    remained, never more than the backoff itself, however the wall clock stepped meanwhile."""
    wall = 1_800_000_000.0  # the wall clock when the restarted master first handles an event
    policy = JobPolicy(backoff_base_s=8.0, backoff_max_s=60.0)  # the first failure waits 8 s
    jobs = [JobRecord("a", "a", 0, JobState.RUNNING, policy, 0.0)]
    rows = [
        row("over", "a", F, attempts=1, lease=1, not_before=wall - 10),  # due while it was down
        row("left", "a", F, attempts=1, lease=2, not_before=wall + 5),  # 5 s of its 8 s left
        row("ahead", "a", F, attempts=1, lease=3, not_before=wall + 3600),  # clock stepped back an hour
    ]
    book = TaskBook.restore(jobs, rows)
    book.handle(WorkerJoined("w", "n", Resources(10, 0), 10), 50.0, wall)

    def leased(now: float) -> list[str]:
        out = book.handle(RequestTask("w", 10), now, wall + now - 50.0)
        return [c.task_id for c in out if isinstance(c, Lease)]

    assert leased(50.0) == ["over"]
    assert leased(54.9) == []
    assert leased(55.0) == ["left"]
    assert leased(57.9) == []
    assert leased(58.0) == ["ahead"]  # 8 s, its backoff, not an hour
