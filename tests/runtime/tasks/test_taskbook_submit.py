"""A submit taken in as a whole: the same book as task by task, and the same refusals."""

from __future__ import annotations

from collections import Counter

from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.state import (
    Lease,
    Reject,
    RequestTask,
    Resources,
    SubmitJob,
    TaskSpec,
    TaskState,
    WorkerJoined,
)

CPU, GPU = Resources(1, 0), Resources(1, 1)


def mixed(n: int) -> list[TaskSpec]:
    """Tasks whose kinds, needs and localities change from one to the next, in no long runs."""
    return [
        TaskSpec(
            f"t{i:03d}",
            "a" if i % 2 else "b",
            i,
            needs=GPU if i % 3 == 0 else Resources(1, 0),  # equal needs, not one shared object
            locality="n2" if i % 5 == 0 else None,
        )
        for i in range(n)
    ]


def test_a_mixed_submit_counts_what_waits_and_leases_in_submit_order() -> None:
    """Counts by kind and needs are those of the tasks; a worker gets every task it can run,
    oldest first, across kinds, needs and localities; the others stay pending."""
    tasks = mixed(30)
    book = TaskBook()
    book.handle(SubmitJob("j", tasks), 0.0)
    (summary,) = book.jobs()
    waiting = {(w.kind, w.needs): w.tasks for w in summary.waiting}
    assert waiting == Counter((t.kind, t.needs) for t in tasks)
    assert summary.counts[TaskState.PENDING] == summary.total == 30

    book.handle(WorkerJoined("w", "n1", Resources(30, 0), 30), 1.0)
    granted = [c.task_id for c in book.handle(RequestTask("w", 30), 1.0) if isinstance(c, Lease)]
    assert granted == [t.task_id for t in tasks if t.needs.gpu == 0]
    stats = book.statistics()
    assert (stats.tasks[TaskState.LEASED], stats.tasks[TaskState.PENDING]) == (20, 10)
    (summary,) = book.jobs()
    assert {(w.kind, w.needs): w.tasks for w in summary.waiting} == Counter(
        (t.kind, t.needs) for t in tasks if t.needs.gpu
    )


def test_a_later_job_queues_behind_an_earlier_one_of_the_same_kind() -> None:
    """A second job's tasks, appended after the first's, come after them (same priority)."""
    book = TaskBook()
    book.handle(SubmitJob("x", [TaskSpec(f"x{i}", "k", i) for i in range(3)]), 0.0)
    book.handle(SubmitJob("y", [TaskSpec(f"y{i}", "k", i) for i in range(3)]), 0.0)
    book.handle(WorkerJoined("w", "n", Resources(6, 0), 6), 1.0)
    granted = [c.task_id for c in book.handle(RequestTask("w", 6), 1.0) if isinstance(c, Lease)]
    assert granted == ["x0", "x1", "x2", "y0", "y1", "y2"]


def test_the_first_wrong_task_in_order_is_the_one_named() -> None:
    """A job with several problems is refused naming the first, in task order, as before."""
    book = TaskBook()
    book.handle(SubmitJob("old", [TaskSpec("taken", "k", 0)]), 0.0)
    a, taken = TaskSpec("a", "k", 0), TaskSpec("taken", "k", 1)
    cases = [
        ([a, TaskSpec("b", "k", 1, needs=Resources(-1, 0)), a], "'b' needs"),
        ([a, a, TaskSpec("c", "k", 2, needs=Resources(1, -1))], "'a' is used"),
        ([a, taken], "'taken' is used twice"),
    ]
    for i, (tasks, named) in enumerate(cases):
        (reject,) = book.handle(SubmitJob(f"new{i}", tasks), 1.0)
        assert isinstance(reject, Reject) and named in reject.reason, reject
    assert [j.job_id for j in book.jobs()] == ["old"]
    assert book.statistics().tasks[TaskState.PENDING] == 1
