"""Retrying a job's dead tasks (``RetryDead``): back to pending with no attempts counted, the
failed job running again, and every state change journaled so a restart keeps it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from support.journal_drive import drive, leases
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.state import (
    Ack,
    AckOutcome,
    CancelJob,
    Command,
    Complete,
    Event,
    Fail,
    JobFinished,
    JobPolicy,
    JobRecord,
    JobState,
    Lease,
    Record,
    Reject,
    RequestTask,
    Resources,
    RetryDead,
    Speculation,
    SubmitJob,
    TaskRecord,
    TaskSpec,
    TaskState,
    WorkerJoined,
)

C = TypeVar("C")
ONCE = JobPolicy(max_attempts=1, speculation=Speculation(False))


def only(commands: Iterable[Command], kind: type[C]) -> list[C]:
    return [c for c in commands if isinstance(c, kind)]


def failed_job(book: TaskBook, journal: Journal | None = None) -> list[Lease]:
    """Job ``j`` of three tasks, one attempt each: ``a`` done, ``b`` and ``c`` dead; it ended failed."""

    def handle(event: Event, now: float) -> list[Command]:
        return book.handle(event, now) if journal is None else drive(book, journal, event, now)

    handle(WorkerJoined("w", "n", Resources(4, 0), 4), 0.0)
    handle(SubmitJob("j", [TaskSpec(t, "k", i) for i, t in enumerate("abc")], ONCE), 0.0)
    granted = {g.task_id: g for g in only(handle(RequestTask("w", 3), 1.0), Lease)}
    handle(Complete("w", "a", granted["a"].lease_id, "out://a"), 2.0)
    handle(Fail("w", "b", granted["b"].lease_id, "disk full", "tb"), 2.0)
    ended = handle(Fail("w", "c", granted["c"].lease_id, "disk full", "tb"), 2.0)
    assert only(ended, JobFinished) == [JobFinished("j", JobState.FAILED)]
    return list(granted.values())


def test_retry_puts_dead_tasks_back_with_no_attempts_and_the_job_runs_again() -> None:
    book = TaskBook()
    old = {lease.task_id: lease for lease in failed_job(book)}
    out = book.handle(RetryDead("j"), 10.0)
    records = [r.entry for r in only(out, Record)]
    assert next(e for e in records if isinstance(e, JobRecord)).state is JobState.RUNNING
    tasks = {e.task_id: e for e in records if isinstance(e, TaskRecord)}
    assert sorted(tasks) == ["b", "c"]
    assert all((e.state, e.attempts, e.error) == (TaskState.PENDING, 0, None) for e in tasks.values())
    assert book.dead_letters("j") == []
    assert next(iter(book.jobs())).state is JobState.RUNNING
    again = only(book.handle(RequestTask("w", 3), 11.0), Lease)
    assert sorted(g.task_id for g in again) == ["b", "c"]
    assert all(g.attempt == 1 and g.lease_id > old[g.task_id].lease_id for g in again)
    by_id = {g.task_id: g for g in again}
    book.handle(Complete("w", "b", by_id["b"].lease_id, "r"), 12.0)
    finished = book.handle(Complete("w", "c", by_id["c"].lease_id, "r"), 12.0)
    assert only(finished, JobFinished) == [JobFinished("j", JobState.DONE)]


def test_a_retried_task_that_dies_again_ends_the_job_failed_again() -> None:
    book = TaskBook()
    failed_job(book)
    book.handle(RetryDead("j"), 10.0)
    again = only(book.handle(RequestTask("w", 3), 11.0), Lease)
    book.handle(Complete("w", again[0].task_id, again[0].lease_id, "r"), 12.0)
    out = book.handle(Fail("w", again[1].task_id, again[1].lease_id, "still full", "tb"), 12.0)
    assert only(out, JobFinished) == [JobFinished("j", JobState.FAILED)]
    assert [(d.task_id, d.error) for d in book.dead_letters("j")] == [(again[1].task_id, "still full")]


def test_an_old_copys_late_complete_still_commits_a_retried_task() -> None:
    """A committed output is the truth: the dead copy's commit counts even after the retry."""
    book = TaskBook()
    old = {lease.task_id: lease for lease in failed_job(book)}
    book.handle(RetryDead("j"), 10.0)
    out = book.handle(Complete("w", "b", old["b"].lease_id, "out://b"), 11.0)
    assert only(out, Ack)[0].outcome is AckOutcome.COMMITTED
    assert book.task("b").state is TaskState.DONE


def test_a_job_with_no_dead_tasks_is_left_as_it_is() -> None:
    book = TaskBook()
    book.handle(WorkerJoined("w", "n", Resources(4, 0), 4), 0.0)
    book.handle(SubmitJob("j", [TaskSpec("a", "k", 0)], ONCE), 0.0)
    (lease,) = only(book.handle(RequestTask("w", 1), 1.0), Lease)
    book.handle(Complete("w", "a", lease.lease_id, "r"), 2.0)
    assert book.handle(RetryDead("j"), 3.0) == []
    assert next(iter(book.jobs())).state is JobState.DONE


def test_an_unknown_or_cancelled_job_is_refused() -> None:
    book = TaskBook()
    (unknown,) = only(book.handle(RetryDead("nope"), 0.0), Reject)
    assert "unknown job 'nope'" in unknown.reason
    book.handle(WorkerJoined("w", "n", Resources(4, 0), 4), 0.0)
    book.handle(SubmitJob("j", [TaskSpec("a", "k", 0), TaskSpec("b", "k", 1)], ONCE), 0.0)
    (lease, _) = only(book.handle(RequestTask("w", 2), 1.0), Lease)
    book.handle(Fail("w", lease.task_id, lease.lease_id, "boom", "tb"), 2.0)
    book.handle(CancelJob("j"), 3.0)
    (refused,) = only(book.handle(RetryDead("j"), 4.0), Reject)
    assert "was cancelled" in refused.reason
    assert len(book.dead_letters("j")) == 1


def test_a_retry_survives_a_restart_from_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        failed_job(book, journal)
        drive(book, journal, RetryDead("j"), 10.0)
    with Journal.open(path) as journal:
        restored = journal.replay()
    (job,) = restored.jobs()
    assert (job.state, job.counts[TaskState.PENDING], job.counts[TaskState.DONE]) == (JobState.RUNNING, 2, 1)
    assert restored.task("b").attempts == 0
    restored.handle(WorkerJoined("w", "n", Resources(4, 0), 4), 20.0)
    assert sorted(g.task_id for g in leases(restored.handle(RequestTask("w", 3), 20.0))) == ["b", "c"]


def test_a_compacted_failed_job_can_be_retried_and_restarts_as_running(tmp_path: Path) -> None:
    """Compaction keeps dead rows: a failed job compacted away can still be retried."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        failed_job(book, journal)
        assert journal.compact(finished_before=1e12).jobs == 1
        book = journal.replay()
        drive(book, journal, RetryDead("j"), 10.0)
    with Journal.open(path) as journal:
        (job,) = journal.replay().jobs()
    assert (job.state, job.total, job.counts[TaskState.PENDING], job.counts[TaskState.DONE]) == (
        JobState.RUNNING,
        3,
        2,
        1,
    )
