"""``troupe master start`` (and a node ``--with-master``) says on stderr that it upgraded an
older troupe's journal, and where the copy it kept lies: it was said only in the master's log,
and the copy stayed beside the journal unexplained (a ``troupe run`` says it as it starts)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from troupe.cli.commands.master import load_journal
from troupe.runtime.tasks.book import TaskBook, split_commands
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.state import SubmitJob, TaskSpec


def _version_2_journal(path: Path) -> None:
    tasks = [TaskSpec(f"t-{i}", "k", i) for i in range(3)]
    records, _ = split_commands(TaskBook().handle(SubmitJob("j", tasks), 0.0))
    with Journal.open(path, create=True) as journal:
        journal.append(records)
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE compacted_jobs DROP COLUMN content")  # what a version-2 journal holds
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()


def test_the_master_says_the_upgrade_and_where_the_copy_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "journal.db"
    _version_2_journal(path)
    journal, book = load_journal(path, new=False)
    journal.close()
    [copy] = tmp_path.glob("journal.db.v2.*.bak")
    assert [j.job_id for j in book.jobs()] == ["j"]
    err = " ".join(capsys.readouterr().err.split())
    assert f"note: journal {path} was an older troupe's (schema version 2) and is upgraded" in err, err
    assert f"a copy as it was is kept in {copy}" in err, err

    load_journal(path, new=False)[0].close()  # upgraded already: nothing more to say
    assert "note:" not in capsys.readouterr().err
