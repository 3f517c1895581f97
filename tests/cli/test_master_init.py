"""``troupe master init`` creates a journal once and never touches an existing one: the master's
systemd unit starts without ``--new``, so a journal lost while the master ran (or a disk not
mounted at boot) keeps it down instead of starting it over on an empty queue."""

from __future__ import annotations

import shlex
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from support.small_disk import small_disk
from troupe.cli.main import app
from troupe.runtime.tasks.master import journal_open
from troupe.runtime.tasks.master.journal_open import open_journal


def test_init_creates_an_empty_journal_that_master_start_opens_without_new(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    result = CliRunner().invoke(app, ["master", "init", "--journal", str(path)])
    assert result.exit_code == 0, result.output
    assert f"created the journal {path}" in result.output
    journal, book = open_journal(path)  # what `master start` without --new does
    try:
        assert book.jobs() == []
    finally:
        journal.close()


def test_the_command_it_suggests_pastes_whole_for_a_path_with_a_space(tmp_path: Path) -> None:
    path = tmp_path / "sp ace" / "j é.db"
    path.parent.mkdir()
    result = CliRunner().invoke(app, ["master", "init", "--journal", str(path)])
    assert result.exit_code == 0, result.output
    suggested = result.output.split("`")[1]  # what the user pastes: it gave --journal .../sp
    assert shlex.split(suggested) == ["troupe", "master", "start", "--journal", str(path)], suggested


def test_init_refuses_an_existing_journal_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    assert CliRunner().invoke(app, ["master", "init", "--journal", str(path)]).exit_code == 0
    before = path.read_bytes()
    result = CliRunner().invoke(app, ["master", "init", "--journal", str(path)])
    assert result.exit_code == 2
    assert "exists already; nothing was changed" in result.output
    assert path.read_bytes() == before


def test_init_into_a_missing_directory_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "not-mounted" / "journal.db"
    result = CliRunner().invoke(app, ["master", "init", "--journal", str(path)])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert f"its folder {path.parent} does not exist: a disk not mounted? nothing was created" in text
    assert not path.parent.exists()


def test_init_given_a_directory_asks_for_the_journal_s_file(tmp_path: Path) -> None:
    """It said "exists already ... master start resumes it" of a folder."""
    result = CliRunner().invoke(app, ["master", "init", "--journal", str(tmp_path)])
    assert result.exit_code == 2
    assert f"is a directory: give the journal's file, e.g. {tmp_path / 'journal.db'}" in result.output
    assert list(tmp_path.iterdir()) == []


def test_init_makes_an_empty_file_a_journal_as_new_does(tmp_path: Path) -> None:
    """It said "exists already ... master start resumes it", and master start refused the file."""
    path = tmp_path / "journal.db"
    path.touch()
    result = CliRunner().invoke(app, ["master", "init", "--journal", str(path)])
    assert result.exit_code == 0, result.output
    journal, _ = open_journal(path)
    journal.close()


def test_init_says_a_file_that_is_no_database_is_no_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    path.write_bytes(b"\x00garbage" * 100)
    result = CliRunner().invoke(app, ["master", "init", "--journal", str(path)])
    assert result.exit_code == 2
    assert "exists and is no journal (not an SQLite database)" in " ".join(result.output.split())
    assert path.read_bytes() == b"\x00garbage" * 100


@pytest.mark.parametrize("left_kib", [4, 16])
def test_an_init_that_fails_on_a_full_disk_says_so_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, left_kib: int
) -> None:
    """It left an empty file (4 KiB free) or an empty database (16 KiB: "disk I/O error"); init
    then said "exists already (master start resumes it)" and master start refused the file."""
    with small_disk(tmp_path / "disk", "4m") as disk:
        path = disk / "journal.db"
        fill = disk / "fill"
        fill.write_bytes(b"\0" * (shutil.disk_usage(disk).free - (left_kib << 10)))
        refused = CliRunner().invoke(app, ["master", "init", "--journal", str(path)])
        assert refused.exit_code == 2  # refused before anything is made: the room is looked at first
        assert "its disk has" in refused.output and "a master needs about" in refused.output
        assert sorted(p.name for p in disk.iterdir()) == ["fill"]

        # The disk fills after the room was looked at (another writer): the create fails part-way.
        monkeypatch.setattr(journal_open, "check_start_room", lambda _: None)
        failed = CliRunner().invoke(app, ["master", "init", "--journal", str(path)])
        text = " ".join(failed.output.split())
        assert failed.exit_code == 2
        assert "full" in text and "I/O" not in text.split(";", 1)[1], text
        assert text.endswith("(init removed what it had made there)"), text
        assert sorted(p.name for p in disk.iterdir()) == ["fill"]

        fill.unlink()
        made = CliRunner().invoke(app, ["master", "init", "--journal", str(path)])
        assert made.exit_code == 0, made.output
        journal, _ = open_journal(path)  # what `master start` without --new does
        journal.close()


def test_init_makes_an_empty_database_a_journal_as_new_does(tmp_path: Path) -> None:
    """What a failed create had left (by an older troupe): "exists already", and master start refused it."""
    path = tmp_path / "journal.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE gone (x)")
    conn.execute("DROP TABLE gone")
    conn.execute("VACUUM")
    conn.close()
    assert path.stat().st_size == 4096
    result = CliRunner().invoke(app, ["master", "init", "--journal", str(path)])
    assert result.exit_code == 0, result.output
    journal, _ = open_journal(path)
    journal.close()
