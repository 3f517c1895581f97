"""The backup scan stops early (tasks are scanned in the order they were leased) yet still
picks the slowest straggler: a task leased first whose first copy ended runs only a later copy,
so it is not the slowest, and the scan must look past it."""

from __future__ import annotations

from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.state import (
    Complete,
    Fail,
    JobPolicy,
    Lease,
    RequestTask,
    Resources,
    Speculation,
    SubmitJob,
    TaskSpec,
    WorkerJoined,
)


def lease(book: TaskBook, worker: str, now: float) -> Lease:
    (got,) = [c for c in book.handle(RequestTask(worker, 1), now) if isinstance(c, Lease)]
    return got


def test_the_backup_goes_to_the_slowest_running_copy_not_the_first_leased_task() -> None:
    book = TaskBook()
    for w in ("w0", "w1", "w2", "w3", "w4", "w5"):
        book.handle(WorkerJoined(w, "n", Resources(), 1), 0.0)
    policy = JobPolicy(lease_s=600, speculation=Speculation(True, 1.5, 0.0, 1))
    book.handle(SubmitJob("j", [TaskSpec(f"t-{i}", "k", i) for i in range(5)], policy), 0.0)
    first = [lease(book, w, 0.0) for w in ("w0", "w1", "w2")]  # t-0, t-1, t-2 run from 0
    for w in ("w3", "w4"):  # t-3, t-4 take 1 s: the median is 1 s, stragglers run over 1.5 s
        done = lease(book, w, 1.0)
        book.handle(Complete(w, done.task_id, done.lease_id, "out", 1.0), 2.0)
    # the tail: t-0 (leased first) gets a backup at 1.6, then its first copy fails
    backup = lease(book, "w3", 1.6)
    assert (backup.task_id, backup.backup) == ("t-0", True)
    book.handle(Fail("w0", "t-0", first[0].lease_id, "boom"), 1.7)
    # t-0 now runs since 1.6 only; t-1 and t-2 since 0: t-1 is the slowest (first of equals)
    again = lease(book, "w4", 4.0)
    assert (again.task_id, again.backup) == ("t-1", True)
    assert book.task("t-0").attempts == 0  # a copy still runs: the failed one cost no attempt
