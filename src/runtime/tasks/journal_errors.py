"""Every ``sqlite3`` error the journal meets, turned into a JournalError that says what to do.

:func:`translated` wraps each step of :class:`~troupe.runtime.tasks.journal.Journal` (opening,
appending, replaying, compacting, closing): a caller of the journal sees
:class:`~troupe.runtime.errors.JournalError` (or ``JournalDamaged``) with a fix, never a bare
``sqlite3.Error``. Apart from ``journal.py``: one table of messages, read on its own.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from troupe.runtime.errors import JournalDamaged, JournalError, TaskError

__all__ = ["translated"]

# SQLite says a write that found no room as "disk I/O error" where it extends its shared-memory
# file (``-shm``) or a page of the database: with less than this free, that is a full disk.
_FULL_BELOW = 1 << 20


@contextmanager
def translated(path: Path, action: str) -> Iterator[None]:
    """Turn sqlite3 (and row-decoding) errors into JournalError with a fix."""
    try:
        yield
    except JournalError:
        raise
    except sqlite3.Error as exc:
        text = str(exc)
        if "not a database" in text or "malformed" in text:
            raise JournalDamaged(
                f"journal {path}: {action} failed: {text}; the file is not a (healthy) journal: "
                "check the path or restore a backup",
                reason=text,
            ) from exc
        if "locked" in text or "busy" in text:
            fix = "another process holds the journal; stop it first"
        elif "unable to open" in text or "readonly" in text:
            fix = "check that the path is a writable file"
        elif "full" in text:
            fix = _full_fix(path)
        elif "I/O" in text:
            free = _free(path)
            fix = (
                f"the disk the journal is on is full ({free >> 10} KiB free): {_full_fix(path)}"
                if free is not None and free < _FULL_BELOW
                else "check the disk the journal is on"
            )
        else:
            fix = "restore the journal from a backup or start a new one"
        raise JournalError(f"journal {path}: {action} failed: {text}; {fix}") from exc
    except (TaskError, ValueError, TypeError, KeyError, OverflowError) as exc:
        raise JournalError(
            f"journal {path}: {action} failed: {exc}; the journal and this troupe disagree about its contents"
        ) from exc


def _full_fix(path: Path) -> str:
    return (
        f"free space on the disk the journal is on (df {path.parent}), then start again: "
        "what was recorded stays"
    )


def _free(path: Path) -> int | None:
    """Free bytes on the disk holding ``path``; None where it cannot be asked."""
    try:
        return shutil.disk_usage(path.parent).free
    except OSError:
        return None
