"""``troupe master compact`` gives the disk back: the journal's file was left at its peak size,
98 % of its pages free, after the rows of a big job were folded (report lk 3). Where the disk has
no room for the rewrite, the file is left as it is and a note says why; the compaction stands."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from support.journal_drive import drive
from support.small_disk import small_disk
from troupe.cli.main import app
from troupe.runtime.errors import JournalError
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.jobspec import generated_task_id
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.state import CancelJob, SubmitJob, TaskSpec

TASKS = 5000


def _journal_with_a_finished_job(path: Path) -> None:
    """A cancelled job of TASKS tasks (finished: compaction folds its rows) and a running one.
    Its ids are the ones it generates: a compaction keeps explicit ids (README, "compacted job
    keeps its counts"), which would hold some of the room."""
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        specs = [TaskSpec(generated_task_id("big", i), "sleep", i) for i in range(TASKS)]
        drive(book, journal, SubmitJob("big", specs), 0.0)
        drive(book, journal, CancelJob("big"), 0.0)
        drive(book, journal, SubmitJob("live", [TaskSpec("x", "sleep", 0)]), 0.0)


def _free_pages(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    finally:
        conn.close()


def _compact(path: Path) -> tuple[int, str, str]:
    done = CliRunner().invoke(app, ["master", "compact", "--journal", str(path)])
    return done.exit_code, " ".join(done.stdout.split()), " ".join(done.stderr.split())


def _jobs(path: Path) -> list[tuple[str, str, int]]:
    journal, book = open_journal(path)  # what a master starting on it does
    journal.close()
    return [(j.job_id, j.state.value, j.total) for j in book.jobs()]


def test_compact_gives_the_rows_room_back_and_says_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _journal_with_a_finished_job(path)
    before = path.stat().st_size
    code, out, err = _compact(path)
    assert code == 0, err
    assert f"{TASKS} task rows folded into counts" in out
    after = path.stat().st_size
    assert f"{path}: {before} bytes before, {after} after" in out
    assert after * 4 < before and _free_pages(path) == 0
    assert not Path(f"{path}-wal").exists() and err == ""
    assert _jobs(path) == [("big", "cancelled", TASKS), ("live", "running", 1)]


def test_a_disk_too_full_for_the_rewrite_keeps_the_file_and_says_why(tmp_path: Path) -> None:
    """The rewrite needs room for a copy: with less, a one-line note, exit 0, the file as it was."""
    with small_disk(tmp_path / "disk", "8m") as disk:
        path = disk / "journal.db"
        _journal_with_a_finished_job(path)
        with Journal.open(path) as journal:
            journal.compact(time.time())  # the rows are folded; their pages left free in the file
        size, free_pages = path.stat().st_size, _free_pages(path)
        assert free_pages > 0
        fill = disk / "fill"
        fill.write_bytes(b"\0" * (shutil.disk_usage(disk).free - (256 << 10)))

        code, out, err = _compact(path)
        assert code == 0, err
        assert f"{path}: {size} bytes before, {size} after" in out
        assert err.startswith(f"note: {path} was not shrunk: a rewrite needs about"), err
        assert "free space there and run `troupe master compact` again to shrink it" in err
        assert (path.stat().st_size, _free_pages(path)) == (size, free_pages)

        fill.unlink()
        code, out, err = _compact(path)
        assert code == 0 and err == "", err
        assert path.stat().st_size * 4 < size and _free_pages(path) == 0
        assert _jobs(path) == [("big", "cancelled", TASKS), ("live", "running", 1)]


def test_a_rewrite_that_fails_is_a_note_and_the_compaction_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk filled after its room was looked at: the compaction is kept, exit 0."""
    path = tmp_path / "journal.db"
    _journal_with_a_finished_job(path)

    def full(self: Journal) -> None:
        raise JournalError(f"journal {self.path}: shrinking failed: database or disk is full; free space")

    monkeypatch.setattr(Journal, "vacuum", full)
    code, out, err = _compact(path)
    assert code == 0, err
    assert f"{TASKS} task rows folded into counts" in out
    assert err.startswith(f"note: {path} was not shrunk: the rewrite failed and changed nothing: journal"), (
        err
    )
    assert _free_pages(path) > 0
    assert _jobs(path) == [("big", "cancelled", TASKS), ("live", "running", 1)]
