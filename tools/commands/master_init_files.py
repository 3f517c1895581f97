"""What ``troupe master init`` finds at the journal's path, and what it takes back when it fails.

Init creates a journal where there is none, an empty file, or an empty SQLite database (what
``--new`` also makes a journal), and changes nothing else. A create that fails part-way (a disk
that fills as SQLite writes its first page) left an empty file or an empty database behind:
init then said "exists already (master start resumes it)" of it, and ``master start`` refused
it. :class:`Made` notes what was there before, and takes back what init added.
"""

from __future__ import annotations

import os
from pathlib import Path

from troupe.runtime.tasks.journal_lock import lock_path

__all__ = ["Made", "is_empty_database", "is_sqlite"]

_SQLITE_MAGIC = b"SQLite format 3\x00"


def is_sqlite(path: Path) -> bool:
    """Whether the file begins as every SQLite database does (read, not opened: init changes
    nothing of a file it refuses)."""
    try:
        with path.open("rb") as f:
            return f.read(16) == _SQLITE_MAGIC
    except OSError:
        return True  # unreadable: the refusal says it exists; master start says the rest


def is_empty_database(path: Path) -> bool:
    """Whether ``path`` is a SQLite database of one page with no application id nor version:
    no table fits in it (each needs a page of its own), so it is what a failed create leaves,
    and nothing else; read from its header, with no ``-wal`` beside it that could hold more."""
    try:
        if os.path.exists(f"{path}-wal") and os.stat(f"{path}-wal").st_size > 0:
            return False
        with path.open("rb") as f:
            header = f.read(100)
    except OSError:
        return False
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        return False
    pages = int.from_bytes(header[28:32], "big")
    user_version = int.from_bytes(header[60:64], "big")
    application_id = int.from_bytes(header[68:72], "big")
    return pages == 1 and user_version == 0 and application_id == 0


class Made:
    """The journal's files as they were before init: :meth:`take_back` removes those init
    created and empties the journal's file again where it had been an empty file."""

    def __init__(self, journal: Path) -> None:
        self._files = [journal, Path(f"{journal}-wal"), Path(f"{journal}-shm"), lock_path(journal)]
        self._there = {f: os.path.lexists(f) for f in self._files}
        self._journal = journal
        self._was_empty = self._there[journal] and journal.stat().st_size == 0

    def take_back(self) -> bool:
        """Undo what init added; return whether anything was there to undo."""
        undone = False
        for f in self._files:
            if not self._there[f] and os.path.lexists(f):
                f.unlink(missing_ok=True)
                undone = True
        if self._was_empty and self._journal.stat().st_size > 0:
            os.truncate(self._journal, 0)
            undone = True
        return undone
