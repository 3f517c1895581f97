"""The same job file submitted again after its job was compacted (its done tasks' rows folded
into counts, as a master does an hour after a job ends) is still "already submitted"; another
content under that id is still refused. It was "job id taken" (a batch script rerun a day later
failed on it). A journal from before the digest keeps the old answer."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from support.journal_drive import drive, leases
from support.older_journal import as_older
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import SCHEMA_VERSION, Journal
from troupe.runtime.tasks.state import (
    Complete,
    JobPolicy,
    RequestTask,
    Resources,
    SubmitJob,
    TaskSpec,
    WorkerJoined,
)

POLICY = JobPolicy(max_attempts=2)


def _specs(seed_start: int = 0) -> list[TaskSpec]:
    return [TaskSpec(f"j-{i:06d}", "k", seed_start + i, {"p": "cas://sha256/" + "a" * 64}) for i in range(6)]


def _done_job(path: Path) -> None:
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        drive(book, journal, SubmitJob("j", _specs(), POLICY), 0.0)
        drive(book, journal, WorkerJoined("w", "n", Resources(6, 0), 6), 0.0)
        granted = leases(drive(book, journal, RequestTask("w", 6), 1.0))
        for lease in granted:
            drive(book, journal, Complete("w", lease.task_id, lease.lease_id, "r"), 2.0)
        assert journal.compact(time.time()).jobs == 1


def test_the_same_job_again_after_compaction_is_already_there(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _done_job(path)
    with Journal.open(path) as journal:
        book = journal.replay()
    assert book.same_job("j", _specs(), POLICY, "j")
    assert not book.same_job("j", _specs(seed_start=1), POLICY, "j")  # other seeds: other content
    assert not book.same_job("j", _specs()[:5], POLICY, "j")
    assert not book.same_job("j", _specs(), JobPolicy(max_attempts=3), "j")


def test_a_journal_compacted_before_the_digest_is_upgraded_and_refuses_as_before(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _done_job(path)
    as_older(path, 2, "ALTER TABLE compacted_jobs DROP COLUMN content")  # what a version-2 journal holds
    with Journal.open(path) as journal:
        book = journal.replay()
    assert not book.same_job("j", _specs(), POLICY, "j")  # nothing to compare by: refused, as before
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
