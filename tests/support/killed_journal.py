"""A journal whose process was SIGKILLed after two submits: its last records are in the
``-wal`` beside it, and its open mark (``journal_opened.py``) is still in its file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

KILLED_AFTER_A_SUBMIT = """
import os, signal, sys
from troupe.runtime.tasks.book import TaskBook, split_commands
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.state import SubmitJob, TaskSpec

book, journal = TaskBook(), Journal.open(sys.argv[1], create=True)
for job in ("first", "acknowledged"):
    tasks = [TaskSpec(f"{job}-{i}", "k", i) for i in range(5)]
    records, _ = split_commands(book.handle(SubmitJob(job, tasks), 0.0))
    journal.append(records)
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def run_killed(script: str, path: Path) -> subprocess.CompletedProcess[str]:
    """``script`` (a Python program that ends by SIGKILLing itself, as a killed master) run on
    the journal at ``path``: its process, which the kill ended."""
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -9, child.stderr
    return child


def killed_master(path: Path) -> int:
    """A master's journal at ``path`` whose master was killed after two submits; its pid."""
    child = run_killed(KILLED_AFTER_A_SUBMIT, path)
    assert Path(f"{path}-wal").stat().st_size > 0  # what the report saw: the jobs are in the log
    return int(child.stdout.split()[0])


def moved_without_its_wal(folder: Path) -> tuple[Path, int]:
    """A killed master's journal moved from ``folder/old`` to ``folder/elsewhere`` alone: its
    path there, and the pid that left it open."""
    old, elsewhere = folder / "old", folder / "elsewhere"
    old.mkdir()
    elsewhere.mkdir()
    pid = killed_master(old / "journal.db")
    (old / "journal.db").rename(elsewhere / "journal.db")
    return elsewhere / "journal.db", pid
