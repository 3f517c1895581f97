"""A finished job folded in a running book (``TaskBook.fold``, a running master's compaction):
its done and cancelled tasks dropped and counted instead, its dead ones kept, and the book the
same as the one a restart reads back from the compacted journal."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

import pytest

from support.journal_drive import drive, leases
from troupe.runtime.errors import TaskError
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.job_digest import job_digest
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.state import (
    CancelJob,
    Command,
    Complete,
    Fail,
    JobPolicy,
    JobState,
    Lease,
    Reject,
    RequestTask,
    Resources,
    RetryDead,
    SchedulerTick,
    Speculation,
    SubmitJob,
    TaskSpec,
    TaskState,
    WorkerJoined,
)

C = TypeVar("C")
ONCE = JobPolicy(max_attempts=1, speculation=Speculation(False))
REF = {"scene": "cas://sha256/" + "a" * 64}
DONE, DEAD, CANCELLED = TaskState.DONE, TaskState.DEAD, TaskState.CANCELLED


def only(commands: Iterable[Command], kind: type[C]) -> list[C]:
    return [c for c in commands if isinstance(c, kind)]


def specs(job_id: str, n: int) -> list[TaskSpec]:
    return [TaskSpec(f"{job_id}-{i}", "k", i, REF) for i in range(n)]


def failed_job(book: TaskBook, journal: Journal) -> list[Lease]:
    """Job ``f`` of four tasks: three done, ``f-1`` dead; it ended failed."""
    drive(book, journal, WorkerJoined("w", "n", Resources(8, 0), 8), 0.0)
    drive(book, journal, SubmitJob("f", specs("f", 4), ONCE), 0.0)
    granted = leases(drive(book, journal, RequestTask("w", 4), 1.0))
    for lease in granted:
        if lease.task_id == "f-1":
            drive(book, journal, Fail("w", "f-1", lease.lease_id, "disk full", "tb"), 2.0)
        else:
            drive(book, journal, Complete("w", lease.task_id, lease.lease_id, "out"), 2.0)
    return granted


def cancelled_job(book: TaskBook, journal: Journal) -> None:
    """Job ``c`` of three tasks: ``c-0`` done, the rest cancelled, ``c-1`` while backing off."""
    policy = JobPolicy(max_attempts=3, backoff_base_s=50.0, speculation=Speculation(False))
    drive(book, journal, SubmitJob("c", specs("c", 3), policy), 3.0)
    granted = {g.task_id: g for g in leases(drive(book, journal, RequestTask("w", 2), 3.0))}
    drive(book, journal, Complete("w", "c-0", granted["c-0"].lease_id, "out"), 4.0)
    drive(book, journal, Fail("w", "c-1", granted["c-1"].lease_id, "flaky", "tb"), 4.0)
    drive(book, journal, CancelJob("c"), 5.0)


def view(book: TaskBook) -> list[tuple[object, ...]]:
    """What ``ctl jobs`` counts: each job's state, total and counts by state (not its refs,
    shown from its first task while it has one, as after a restart)."""
    return [(j.job_id, j.state, j.total, dict(j.counts)) for j in book.jobs()]


def fold_both(book: TaskBook, journal: Journal) -> dict[str, str]:
    """What a running master's compaction does: the journal first, then the book."""
    digests = {j: job_digest(book.job_specs(j)) for j in journal.compactable(time.time())}
    done = journal.compact(time.time(), digests)
    for job_id in done.job_ids:
        book.fold(job_id, digests[job_id])
    while book.forget_folded(2):  # a slice at a time, as the master does
        pass
    return digests


def test_a_folded_job_keeps_its_counts_and_dead_letters_and_forgets_its_done_tasks(tmp_path: Path) -> None:
    book = TaskBook()
    with Journal.open(tmp_path / "j.db", create=True) as journal:
        granted = failed_job(book, journal)
        cancelled_job(book, journal)
        before = view(book)
        totals = dict(book.statistics().tasks)
        digests = fold_both(book, journal)
    assert sorted(digests) == ["c", "f"]
    assert view(book) == before
    assert dict(book.statistics().tasks) == totals
    f, c = book._jobs["f"], book._jobs["c"]
    assert (f.compacted, f.digest, [t.spec.task_id for t in f.tasks]) == (3, digests["f"], ["f-1"])
    assert (c.compacted, c.digest, c.tasks) == (3, digests["c"], [])
    assert digests["f"] == job_digest(specs("f", 4))  # every task, in submit order
    assert [d.task_id for d in book.dead_letters("f")] == ["f-1"]
    assert book.dead_letters("f")[0].error == "disk full"
    with pytest.raises(TaskError, match="unknown task 'f-0'"):
        book.task("f-0")
    late = granted[0]
    (refused,) = only(book.handle(Complete("w", late.task_id, late.lease_id, "out"), 9.0), Reject)
    assert refused.reason == f"unknown task {late.task_id!r}"
    assert book.same_job("f", specs("f", 4), ONCE, "f")  # a submit of it again: "already"
    assert not book.same_job("f", specs("f", 3), ONCE, "f")
    assert book.handle(SchedulerTick(), 100.0) == []  # c-1's backoff ends after it was dropped
    with pytest.raises(TaskError, match="nothing to fold"):
        book.fold("f", digests["f"])  # folded already


def test_a_running_job_is_not_folded() -> None:
    book = TaskBook()
    book.handle(SubmitJob("r", specs("r", 2), ONCE), 0.0)
    with pytest.raises(TaskError, match="job 'r' is not a finished job"):
        book.fold("r", "x")
    assert book.job_specs("r") == specs("r", 2)


def test_the_folded_book_is_the_one_a_restart_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        failed_job(book, journal)
        cancelled_job(book, journal)
        fold_both(book, journal)
        restored = journal.replay()
    jobs, dead, digest = book.jobs(), book.dead_letters("f"), book._jobs["f"].digest
    for b in (book, restored):  # the same, and going on the same: a retry, new leases
        assert b.jobs() == jobs  # refs and all
        assert b.dead_letters("f") == dead
        assert (b._jobs["f"].digest, b._jobs["c"].compacted) == (digest, 3)
        assert b.handle(RetryDead("f"), 10.0)
        b.handle(WorkerJoined("w", "n", Resources(8, 0), 8), 10.0)
        (again,) = leases(b.handle(RequestTask("w", 8), 10.0))
        assert again.task_id == "f-1" and again.lease_id > 6  # above every lease issued
        b.handle(Complete("w", "f-1", again.lease_id, "out"), 11.0)
    assert restored.jobs() == book.jobs()
    (f, _) = book.jobs()
    assert (f.state, f.total, f.counts[DONE], f.counts[DEAD]) == (JobState.DONE, 4, 4, 0)


def test_a_job_retried_after_it_was_named_is_not_compacted(tmp_path: Path) -> None:
    """The master digests a job between its batches: a retry meanwhile runs it again, and the
    journal's transaction leaves it out, so the book keeps every task of it too."""
    book = TaskBook()
    with Journal.open(tmp_path / "j.db", create=True) as journal:
        failed_job(book, journal)
        (named,) = journal.compactable(time.time())
        digests = {named: job_digest(book.job_specs(named))}
        drive(book, journal, RetryDead("f"), 10.0)
        assert journal.compact(time.time(), digests).job_ids == ()
        assert journal.compactable(time.time()) == []  # running: nothing to name
    assert len(book.job_specs("f")) == 4
