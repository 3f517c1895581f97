"""Whether a journal was closed cleanly, and a ``-wal`` found without its journal.

A journal in WAL mode is two files while a master has it open, and after that master dies
(SIGKILL, a host lost): ``<journal>`` and ``<journal>-wal``, which holds every record since the
last checkpoint (``journal_wal.py``: up to 256 pages, jobs acknowledged to their submitters). A
clean close checkpoints the log into the journal and deletes it. An operator who moved
``journal.db`` alone after a crash started a master on it that said nothing and had lost those
records; at the old folder, the ``-wal`` left behind met "does not exist; ... pass --new", and
``--new`` started an empty journal over it (SQLite deletes the ``-wal`` beside a new database).

Two checks, both only read what lies there:

- :func:`refuse_orphaned_wal`: a non-empty ``<journal>-wal`` where ``<journal>`` is missing is
  refused, ``--new`` or not: the journal was moved or deleted after an unclean stop.
- The open mark, a row of ``opened_by`` (pid, host, when) written by :func:`mark_open` as a
  journal is opened read-write, checkpointed into the journal's own file at once, and deleted by
  :func:`mark_closed` as it is closed. A journal opened with the row in its file and no ``-wal``
  beside it was not closed cleanly and its log is not here: :func:`left_open` returns who had it
  open, for a warning (not a refusal: the journal is whole as of its last checkpoint, and a copy
  of a live journal made some other way reads the same). A journal without the table (an older
  troupe's, a copy kept before an upgrade) opens quietly; the table needs no schema version of
  its own, as a troupe that does not know it reads none of it (``journal_schema.py``).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from troupe.runtime.errors import JournalError

__all__ = [
    "OPENED_BY_TABLE",
    "LeftOpen",
    "left_open",
    "mark_closed",
    "mark_open",
    "refuse_orphaned_wal",
    "wal_bytes",
]

OPENED_BY_TABLE = """CREATE TABLE IF NOT EXISTS opened_by (
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        opened_at REAL NOT NULL
    )"""


@dataclass(frozen=True, slots=True)
class LeftOpen:
    """A journal opened without its ``-wal`` though it was not closed cleanly: who had it open.

    Attributes:
        pid: the process that opened it last.
        host: that process's host name.
        opened_at: when, in epoch seconds.
    """

    pid: int
    host: str
    opened_at: float

    def said(self, path: Path, goes_on: str = "this master") -> str:
        """What it means, in a line for the operator (after ``note: ``); ``goes_on`` names what
        opened it and goes on without the lost records (``this run``, ``this compaction``)."""
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.opened_at))
        wal = f"{path.name}-wal"
        return (
            f"journal {path} was not closed cleanly (opened by pid {self.pid} on {self.host} at "
            f"{when}) and no {wal} is beside it: if it was moved or copied after a crash, the "
            f"{wal} left where it was held its last records (jobs submitted, tasks done), which "
            f"{goes_on} goes on without; move {wal} and {path.name}-shm with the journal "
            "(README, Deployment: moving the master's journal)"
        )


def wal_bytes(path: Path) -> int:
    """The size of ``<path>-wal``, 0 where there is none (or it cannot be read)."""
    try:
        return os.stat(f"{path}-wal").st_size
    except OSError:
        return 0


def refuse_orphaned_wal(path: Path) -> None:
    """Refuse a missing journal beside a non-empty ``-wal``, ``--new`` or not: its records are
    there, and a journal started at ``path`` would delete them.

    Raises:
        JournalError: ``path`` is missing and ``<path>-wal`` holds bytes.
    """
    if os.path.lexists(path):
        return
    size = wal_bytes(path)
    if size == 0:
        return
    wal = f"{path.name}-wal"
    raise JournalError(
        f"journal {path} does not exist, but a {size}-byte {wal} is there: the journal was moved or "
        f"deleted after an unclean stop (a crash, SIGKILL) and {wal} holds its last records; move "
        f"{wal} and {path.name}-shm beside the journal before a master opens it there, or delete "
        "them to discard those records (nothing was changed)"
    )


def left_open(conn: sqlite3.Connection, had_wal: bool) -> LeftOpen | None:
    """Who left the journal open on ``conn`` without closing it, where its log is missing
    (``had_wal``: a non-empty ``-wal`` lay beside it before it was opened); else None."""
    if had_wal or not _has_table(conn):
        return None
    row = conn.execute("SELECT pid, host, opened_at FROM opened_by ORDER BY rowid DESC LIMIT 1").fetchone()
    return None if row is None else LeftOpen(int(row[0]), str(row[1]), float(row[2]))


def mark_open(conn: sqlite3.Connection) -> None:
    """Mark the journal on ``conn`` open by this process, in the journal's own file: checkpointed
    at once, so that the mark travels with the file even where its ``-wal`` does not."""
    conn.execute(OPENED_BY_TABLE)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("DELETE FROM opened_by")
        conn.execute(
            "INSERT INTO opened_by (pid, host, opened_at) VALUES (?, ?, ?)",
            (os.getpid(), socket.gethostname(), time.time()),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def mark_closed(conn: sqlite3.Connection) -> None:
    """Take the open mark off the journal on ``conn``, as it is about to be closed (the close
    checkpoints the deletion into the file). A transaction still open is left to the close,
    which rolls it back: the mark stays, and the next open says so where the log is gone.

    The deletion's commit is not synced on its own (``synchronous = NORMAL``): the close's
    checkpoint syncs the log before it copies it into the file, then the file, before it
    deletes the log (SQLite's ``walCheckpoint``, ``sqlite3WalClose``), so a sync here was a
    third where two make it durable. Where the close cannot checkpoint (another connection has
    the journal open) the log stays beside it, and an open with a log there reads no mark."""
    if conn.in_transaction or not _has_table(conn):
        return
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("DELETE FROM opened_by")


def _has_table(conn: sqlite3.Connection) -> bool:
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'opened_by'")
    return found.fetchone() is not None
