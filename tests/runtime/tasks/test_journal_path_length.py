"""A journal path longer than SQLite opens (504 bytes, 512 with its '-journal') is refused by
name, with the limit, before anything is made: it failed as "unable to open database file;
check that the path is a writable file", the folder writable and the file even created. ev 2"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.cli_session import troupe_in_session
from support.long_paths import path_of_length
from troupe.runtime.errors import JournalError
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.journal_path import LONGEST_PATH
from troupe.runtime.transports.loopback import free_endpoint

REFUSAL_S = 120  # a refusal comes before anything starts; a bound only, should it start after all


def test_the_longest_path_sqlite_opens_is_a_journal_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    longest = path_of_length(tmp_path / "a", LONGEST_PATH, "j.db")
    Journal.open(longest, create=True).close()
    over = path_of_length(tmp_path / "b", LONGEST_PATH + 1, "j.db")
    with pytest.raises(JournalError) as refused:
        Journal.open(over, create=True)
    assert str(refused.value) == (
        f"journal {over} is a path of 505 bytes; SQLite opens at most 504 (512 with the '-journal' "
        "it adds): give a shorter path"
    )
    assert os.listdir(over.parent) == []


def test_it_is_measured_as_sqlite_does_through_links(tmp_path: Path) -> None:
    over = path_of_length(tmp_path / "b", LONGEST_PATH + 1, "j.db")
    (tmp_path / "short").symlink_to(over.parent)
    with pytest.raises(JournalError, match=r"is a path of 505 bytes; SQLite opens at most 504"):
        Journal.open(tmp_path / "short" / "j.db", create=True)


def test_troupe_run_refuses_an_out_whose_journal_would_be_too_long(tmp_path: Path) -> None:
    out = path_of_length(tmp_path, 509, "ou/.troupe/journal.db").parent.parent  # not made
    done = troupe_in_session(
        "run",
        "--items",
        "1",
        "--out",
        str(out),
        "--endpoint",
        free_endpoint(),
        "--master",
        free_endpoint(),
        timeout=REFUSAL_S,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr == (
        f"error: --out {out}: the run's journal there (.troupe/journal.db) would be a path of 509 bytes; "
        "SQLite opens at most 504 (512 with the '-journal' it adds): use a shorter --out\n"
    )
    assert not out.exists()
