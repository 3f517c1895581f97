"""A one-host run's journal, damaged on disk, is set aside and the run goes on from its outputs.

What a user relies on: a run whose ``out/.troupe/journal.db`` was cut short or overwritten is
not refused with advice (``--fresh``) that would make every committed item again; the damaged
file is kept beside it as ``journal.db.damaged``, the user is told in one line, and the run
starts on an empty journal (its stages' ``start`` lists what is committed). A journal held by
another process is not damaged: still refused, and left where it is. An older troupe's journal
is upgraded, and the copy of it kept beside is said.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from support.killed_journal import moved_without_its_wal
from troupe.runtime.pipeline.run_journal import open_run_journal
from troupe.runtime.tasks.book import TaskBook, split_commands
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.journal_lock import JournalBusy, JournalLock
from troupe.runtime.tasks.state import RequestTask, Resources, SubmitJob, TaskSpec, TaskState, WorkerJoined


def _journal_with_a_job(path: Path) -> None:
    tasks = [TaskSpec(f"t-{i}", "k", i) for i in range(100)]
    records, _ = split_commands(TaskBook().handle(SubmitJob("j", tasks), 0.0))
    with Journal.open(path, create=True) as journal:
        journal.append(records)


@pytest.mark.parametrize("damage", ["cut", "overwritten"])
def test_a_damaged_journal_is_kept_aside_and_a_new_one_opened(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "journal.db"
    _journal_with_a_job(path)
    if damage == "cut":
        with path.open("r+b") as f:
            f.truncate(2000)
    else:
        path.write_bytes(b"not a database at all" * 100)
    damaged = path.read_bytes()
    said: list[str] = []
    journal, book = open_run_journal(path, said.append)
    try:
        assert book.jobs() == []  # an empty journal: the outputs say what was made
        assert (tmp_path / "journal.db.damaged").read_bytes() == damaged
        assert len(said) == 1 and f"the run's journal {path} was damaged (" in said[0]
        assert "kept as journal.db.damaged" in said[0] and "--fresh" not in said[0]
    finally:
        journal.close()
    with Journal.open(path) as again:  # what was opened is a healthy journal, kept as such
        assert again.replay().jobs() == []


def test_a_healthy_journal_opens_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _journal_with_a_job(path)
    said: list[str] = []
    journal, book = open_run_journal(path, said.append)
    journal.close()
    assert [j.job_id for j in book.jobs()] == ["j"] and said == []
    assert not (tmp_path / "journal.db.damaged").exists()


def test_a_journal_another_process_holds_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _journal_with_a_job(path)
    with Journal.open(path), pytest.raises(JournalBusy):
        open_run_journal(path)
    assert not (tmp_path / "journal.db.damaged").exists()


def test_a_damaged_journal_is_set_aside_under_the_lock_the_run_handed_over(tmp_path: Path) -> None:
    """The lock the run held since its checks is the journal's once it opens, a damaged file set
    aside meanwhile: no other run takes the folder in between; the journal's close frees it."""
    path = tmp_path / "journal.db"
    _journal_with_a_job(path)
    path.write_bytes(b"not a database at all" * 100)
    lock = JournalLock.acquire(path)
    journal, book = open_run_journal(path, None, lock)
    try:
        assert book.jobs() == [] and (tmp_path / "journal.db.damaged").exists()
        assert lock.held
        with pytest.raises(JournalBusy):
            JournalLock.acquire(path)
        os.link(path, tmp_path / "hard.db")  # the new file is held too, by any of its names
        with pytest.raises(JournalBusy):
            JournalLock.acquire(tmp_path / "hard.db")
    finally:
        journal.close()
    assert not lock.held


def test_a_journal_of_an_older_troupe_is_upgraded_and_its_copy_said(tmp_path: Path) -> None:
    """The copy kept before an upgrade stays in the run's folder until --fresh: it was said only
    in the run's log (``journal_upgraded``), and the user found a .bak there later (report up 5)."""
    path = tmp_path / "journal.db"
    _journal_with_a_job(path)
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE compacted_jobs DROP COLUMN content")  # what a version-2 journal holds
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    said: list[str] = []
    journal, book = open_run_journal(path, said.append)
    journal.close()
    [copy] = tmp_path.glob("journal.db.v2.*.bak")
    assert [j.job_id for j in book.jobs()] == ["j"]
    assert said == [
        f"the run's journal {path} was an older troupe's (schema version 2) and is upgraded for this "
        f"one; a copy as it was is kept in {copy} (put back as journal.db, that troupe resumes from "
        "it; it stays until --fresh)"
    ]
    said.clear()
    open_run_journal(path, said.append)[0].close()  # upgraded already: nothing more to say
    assert said == []


def test_the_items_leased_to_the_run_that_wrote_the_journal_are_pending_at_once(tmp_path: Path) -> None:
    """A master restarted on its journal holds each lease over for its holder to renew (for a
    lease_s); a rerun's journal was leased to the run before it, which is gone: its items go
    back at once, no attempt counted, not a pipeline lease (two minutes) later."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        for event in (
            SubmitJob("j", [TaskSpec(f"t-{i}", "k", i) for i in range(3)]),
            WorkerJoined("source", "local", Resources(2, 0), 2),
            RequestTask("source", 2),
        ):
            journal.append(split_commands(book.handle(event, 0.0))[0])
    journal, book = open_run_journal(path)
    try:
        counts = book.statistics().tasks
        assert (counts[TaskState.PENDING], counts[TaskState.LEASED]) == (3, 0)
        assert {book.task(f"t-{i}").attempts for i in range(3)} == {0}
    finally:
        journal.close()


def test_a_journal_left_open_and_moved_without_its_wal_is_said(tmp_path: Path) -> None:
    """As ``troupe master start`` says it of a master's journal (a ``note:`` line): a run's
    folder moved after a crash without ``journal.db-wal`` was said only in the run's log."""
    path, pid = moved_without_its_wal(tmp_path)
    said: list[str] = []
    journal, _book = open_run_journal(path, said.append)
    journal.close()
    [line] = said
    assert line.startswith(f"the run's journal {path} was not closed cleanly (opened by pid {pid} on "), line
    assert "which this run goes on without; move journal.db-wal and journal.db-shm with the journal" in line
    said.clear()
    open_run_journal(path, said.append)[0].close()  # closed cleanly since: nothing more to say
    assert said == []
