"""``troupe master compact`` on a journal not closed cleanly and found without its ``-wal``
(moved alone after a crash) says so in a ``note:`` line, as ``troupe master start`` does: it
logged ``journal_left_open`` only, and compacted what the journal held as if it were whole."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from support.killed_journal import moved_without_its_wal
from troupe.cli.main import app


def test_compact_says_the_journal_was_left_open_without_its_wal(tmp_path: Path) -> None:
    path, pid = moved_without_its_wal(tmp_path)
    done = CliRunner().invoke(app, ["master", "compact", "--journal", str(path)])
    assert done.exit_code == 0, done.stderr
    err = " ".join(done.stderr.split())
    assert f"note: journal {path} was not closed cleanly (opened by pid {pid} on " in err, err
    assert "held its last records (jobs submitted, tasks done), which this compaction goes on without" in err
    assert "move journal.db-wal and journal.db-shm with the journal" in err, err

    again = CliRunner().invoke(app, ["master", "compact", "--journal", str(path)])  # closed cleanly since
    assert again.exit_code == 0, again.stderr
    assert "note:" not in again.stderr
