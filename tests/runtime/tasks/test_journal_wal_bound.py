"""The journal's write-ahead log is bounded (journal_wal.py), and the room check counts its bound:
a log that grew a 4 KiB page a commit up to SQLite's 4 MB checkpoint, and was never made smaller,
filled a small disk that the submit check had said was enough, and the master stopped mid-job."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from support.journal_drive import drive, leases
from support.small_disk import small_disk
from troupe.runtime.errors import JournalError, TaskError
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.journal_wal import MAX_BYTES, SIZE_LIMIT_BYTES
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.journal_room import check_room, journal_bytes
from troupe.runtime.tasks.state import (
    Complete,
    JobState,
    RequestTask,
    Resources,
    SubmitJob,
    TaskSpec,
    TaskState,
    WorkerJoined,
)

RESULT = "cas://sha256/" + "0" * 64  # a completion's result reference, as long as a real one


def _tasks(job: str, count: int) -> list[TaskSpec]:
    return [TaskSpec(f"{job}-{i:06d}", "sleep", i) for i in range(count)]


def _run_to_its_end(book: TaskBook, journal: Journal, job: str, count: int) -> None:
    """Every task leased and completed one at a time: a commit each, the most commits a task makes."""
    drive(book, journal, SubmitJob(job, _tasks(job, count)), 1.0)
    drive(book, journal, WorkerJoined("w", "n1", Resources(1, 0), 1), 1.0)
    for _ in range(count):
        (lease,) = leases(drive(book, journal, RequestTask("w", 1), 2.0))
        drive(book, journal, Complete("w", lease.task_id, lease.lease_id, RESULT), 2.0)


def _wal_size(path: Path) -> int:
    return os.stat(f"{path}-wal").st_size


def test_the_log_stays_within_its_bound_and_a_big_submit_is_cut_back(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with Journal.open(path, create=True) as journal:
        book = TaskBook()
        drive(book, journal, SubmitJob("big", _tasks("big", 20_000)), 1.0)  # one transaction
        assert _wal_size(path) > SIZE_LIMIT_BYTES  # its pages are in the log, past the bound
        _run_to_its_end(book, journal, "small", 600)  # 1200 commits: past SQLite's own checkpoint
        assert _wal_size(path) <= MAX_BYTES


def test_a_job_the_room_check_accepts_runs_to_its_end_on_a_small_disk(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "3m") as disk:
        path = disk / "journal.db"
        journal, book = open_journal(path, new=True)
        with journal:
            fit = _most_accepted(path, _tasks("fill", 20_000))
            assert journal_bytes(_tasks("fill", fit)) > 256 << 10  # a job of some size
            _run_to_its_end(book, journal, "fill", fit)  # no JournalError: the disk held it
            (job,) = book.jobs()
            assert job.state is JobState.DONE and job.counts[TaskState.DONE] == fit
            assert not _accepted(path, _tasks("fill", 2 * fit))  # twice as big: still refused


def _most_accepted(path: Path, tasks: list[TaskSpec]) -> int:
    """The most of ``tasks`` (a prefix) the room check accepts, found by halving."""
    low, high = 0, len(tasks)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if _accepted(path, tasks[:middle]) else (low, middle - 1)
    assert 0 < low < len(tasks)
    return low


def _accepted(path: Path, tasks: list[TaskSpec]) -> bool:
    try:
        check_room(path, "fill", tasks)
    except TaskError:
        return False
    return True


def test_a_master_on_a_nearly_full_disk_is_refused_as_it_opens_in_one_line(tmp_path: Path) -> None:
    """It started, and stopped at its first write ("disk full") as soon as the nodes sent again."""
    with small_disk(tmp_path / "disk", "3m") as disk:
        path = disk / "journal.db"
        journal, _ = open_journal(path, new=True)
        journal.close()
        (disk / "fill").write_bytes(b"\0" * (shutil.disk_usage(disk).free - (512 << 10)))
        with pytest.raises(JournalError) as refused:
            open_journal(path)
        text = str(refused.value)
        assert "\n" not in text
        assert re.fullmatch(
            rf"journal {re.escape(str(path))}: its disk has \d+ KiB free, and a master needs about "
            rf"\d\.\d\d MiB there \(.*\); free space on it \(df {re.escape(str(disk))}\), then start "
            "again: what was recorded stays",
            text,
        ), text
        os.unlink(f"{disk}/fill")
        open_journal(path)[0].close()  # room made: it opens
        (disk / "fill").write_bytes(b"\0" * (shutil.disk_usage(disk).free - (512 << 10)))
        with pytest.raises(JournalError, match="its disk has"):
            open_journal(disk / "new.db", new=True)
        assert sorted(p.name for p in disk.iterdir()) == ["fill", "journal.db", "journal.db.lock"]
