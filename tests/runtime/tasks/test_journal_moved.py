"""A master's journal moved after a crash: its ``-wal``, left behind, held acknowledged jobs. A
master started on the moved file said nothing and had lost them; at the old folder, the ``-wal``
met "does not exist; ... pass --new", and ``--new`` started an empty journal over it."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
import structlog.testing

from support.killed_journal import killed_master
from troupe.cli.commands.master import load_journal
from troupe.runtime.errors import JournalError
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.journal_backup import keep_copy_before_upgrade
from troupe.runtime.tasks.master.journal_open import open_journal


def _sides(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.endswith(".lock")}


@pytest.mark.parametrize("new", [False, True])
def test_a_wal_left_without_its_journal_is_refused_new_or_not(tmp_path: Path, new: bool) -> None:
    old, elsewhere = tmp_path / "old", tmp_path / "elsewhere"
    old.mkdir()
    elsewhere.mkdir()
    killed_master(old / "journal.db")
    shutil.move(old / "journal.db", elsewhere / "journal.db")
    before = _sides(old)
    path = old / "journal.db"
    for opening in (lambda: open_journal(path, new=new), lambda: Journal.open(path, create=new)):
        with pytest.raises(JournalError) as refused:
            opening()
        said = str(refused.value)
        assert said.startswith(f"journal {path} does not exist, but a ")
        assert "journal.db-wal is there: the journal was moved or deleted after an unclean stop" in said
        assert "move journal.db-wal and journal.db-shm beside the journal" in said
        assert "or delete them to discard those records (nothing was changed)" in said
        assert "--new" not in said and "\n" not in said
    assert _sides(old) == before  # nothing made, nothing deleted


def test_an_empty_wal_left_alone_does_not_stop_a_new_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    Path(f"{path}-wal").touch()  # holds nothing
    with Journal.open(path, create=True) as journal:
        assert journal.replay().jobs() == []


def test_a_journal_moved_without_its_wal_after_a_crash_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, elsewhere = tmp_path / "old", tmp_path / "elsewhere"
    old.mkdir()
    elsewhere.mkdir()
    pid = killed_master(old / "journal.db")
    shutil.move(old / "journal.db", elsewhere / "journal.db")
    path = elsewhere / "journal.db"
    with structlog.testing.capture_logs() as logs:
        journal, book = load_journal(path, new=False)
    journal.close()
    assert "acknowledged" not in {j.job_id for j in book.jobs()}  # lost with the log: hence the note
    assert journal.left_open is not None and journal.left_open.pid == pid
    [warned] = [e for e in logs if e["event"] == "journal_left_open"]
    assert warned["log_level"] == "warning" and warned["opened_by_pid"] == pid
    err = " ".join(capsys.readouterr().err.split())
    assert f"note: journal {path} was not closed cleanly (opened by pid {pid} on " in err, err
    assert "and no journal.db-wal is beside it: if it was moved or copied after a crash" in err, err
    assert "move journal.db-wal and journal.db-shm with the journal" in err, err

    journal, _ = load_journal(path, new=False)  # closed cleanly since: nothing more to say
    journal.close()
    assert journal.left_open is None
    assert "note:" not in capsys.readouterr().err


def test_a_journal_moved_with_its_wal_after_a_crash_opens_quietly_and_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, elsewhere = tmp_path / "old", tmp_path / "elsewhere"
    old.mkdir()
    elsewhere.mkdir()
    killed_master(old / "journal.db")
    for side in ("", "-wal", "-shm"):  # as README says to move it after a crash
        shutil.move(old / f"journal.db{side}", elsewhere / f"journal.db{side}")
    journal, book = load_journal(elsewhere / "journal.db", new=False)
    journal.close()
    assert {j.job_id for j in book.jobs()} == {"first", "acknowledged"}
    assert journal.left_open is None
    assert "note:" not in capsys.readouterr().err


def test_a_clean_close_leaves_the_journal_alone_and_it_moves_alone(tmp_path: Path) -> None:
    """README: stop the master (SIGTERM: its close), then move journal.db alone."""
    path = tmp_path / "journal.db"
    killed_master(path)
    journal, _ = open_journal(path)  # the restart after the crash, stopped cleanly
    journal.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.db", "journal.db.lock"]
    moved = tmp_path / "moved" / "journal.db"
    moved.parent.mkdir()
    shutil.move(path, moved)
    journal, book = open_journal(moved)
    journal.close()
    assert {j.job_id for j in book.jobs()} == {"first", "acknowledged"}
    assert journal.left_open is None


def test_a_copy_kept_before_an_upgrade_opens_quietly_when_put_back(tmp_path: Path) -> None:
    """The rollback of README's "Upgrading a cluster": the copy, put in place of journal.db
    without a -wal, is whole; it must not be taken for a journal moved without its log, though
    it was copied from a journal open at the time."""
    path = tmp_path / "journal.db"
    killed_master(path)
    journal = Journal.open(path)  # open now: marked so in its file
    try:
        conn = sqlite3.connect(path)  # what keep_copy_before_upgrade is handed, of this schema
        try:
            copy = keep_copy_before_upgrade(conn, path, 3)
        finally:
            conn.close()
    finally:
        journal.close()
    put_back = tmp_path / "rolled-back" / "journal.db"
    put_back.parent.mkdir()
    shutil.copyfile(copy, put_back)
    journal, book = open_journal(put_back)
    journal.close()
    assert journal.left_open is None
    assert {j.job_id for j in book.jobs()} == {"first", "acknowledged"}


@pytest.mark.parametrize("reader", [False, True])
def test_a_closed_journal_reopens_with_everything_and_no_open_mark(tmp_path: Path, reader: bool) -> None:
    """sm 5: the close's deletion of the open mark is not synced on its own, as the close's
    checkpoint syncs the log and then the file. With another connection open the close cannot
    checkpoint: the log stays beside the journal, and the journal opens whole and quiet all the same."""
    path = tmp_path / "journal.db"
    killed_master(path)
    journal, _ = open_journal(path)
    other = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) if reader else None
    try:
        if other is not None:
            assert other.execute("SELECT count(*) FROM opened_by").fetchone() == (1,)
        journal.close()
        assert (tmp_path / "journal.db-wal").exists() is reader
    finally:
        if other is not None:
            other.close()
    with structlog.testing.capture_logs() as logs:
        journal, book = open_journal(path)
    journal.close()
    assert {j.job_id for j in book.jobs()} == {"first", "acknowledged"}
    assert journal.left_open is None and not [e for e in logs if e["event"] == "journal_left_open"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.db", "journal.db.lock"]
