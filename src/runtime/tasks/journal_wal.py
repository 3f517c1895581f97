"""The journal's write-ahead log, bounded: how large ``<journal>-wal`` may grow, so that the
room a master needs on its journal's disk is known (``master/journal_room.py`` counts it).

SQLite in WAL mode appends every page a commit changes to ``<journal>-wal`` (a 4 KiB page at
least, and a task commits several times: its lease, its completion), copies them into the
database only at a checkpoint (by default once the log holds 1000 pages, about 4 MB), and then
reuses the log from its start without ever making its file smaller. A master on a disk with
less than that free stopped mid-job with "disk full", whatever its job's size, and a job of a
million tasks (one transaction) left a log of its size behind for good.

Bounded here, on every connection the journal opens (both pragmas are per connection):
``wal_autocheckpoint`` checkpoints every :data:`CHECKPOINT_PAGES` pages (a checkpoint writes
the pages back and fsyncs twice, once per :data:`CHECKPOINT_PAGES` commits at most: measured
no slower, see the commit that set it), and ``journal_size_limit`` cuts the file back to
:data:`SIZE_LIMIT_BYTES` when the log is reused after a checkpoint, so a big submit's pages do
not keep their room. The log then holds at most :data:`MAX_BYTES`, beyond the pages of the one
transaction in hand (a submit's rows: counted with the job, ``journal_room.journal_bytes``).
"""

from __future__ import annotations

import sqlite3

__all__ = ["CHECKPOINT_PAGES", "MAX_BYTES", "PAGE_BYTES", "SIZE_LIMIT_BYTES", "bound_wal"]

PAGE_BYTES = 4096  # SQLite's default page size; the journal never sets another
_FRAME_BYTES = PAGE_BYTES + 24  # each page in the log has a 24-byte frame header
_HEADER_BYTES = 32  # the log file's own header

CHECKPOINT_PAGES = 256
"""Pages the log holds before a commit checkpoints it (SQLite's default: 1000)."""

SIZE_LIMIT_BYTES = _HEADER_BYTES + CHECKPOINT_PAGES * _FRAME_BYTES
"""What the log's file is cut back to when it is reused after a checkpoint (about 1 MiB)."""

_BATCH_PAGES = 64  # a batch of leases and completions committed past the threshold, at most
MAX_BYTES = SIZE_LIMIT_BYTES + _BATCH_PAGES * _FRAME_BYTES
"""The most the log's file holds, a submit's own rows aside: the pages up to the checkpoint,
and the commit that crossed it."""


def bound_wal(conn: sqlite3.Connection) -> None:
    """Set the checkpoint interval and the size limit on ``conn`` (a journal's connection)."""
    conn.execute(f"PRAGMA wal_autocheckpoint = {CHECKPOINT_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit = {SIZE_LIMIT_BYTES}")
