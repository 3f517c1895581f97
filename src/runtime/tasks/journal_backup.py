"""The copy of a journal a master keeps before it upgrades the journal's schema.

A master of a newer troupe rewrites an older journal to its schema as it opens it, and a master
of the older troupe refuses the result (``journal ... has schema version N``). A cluster is
upgraded a host at a time, and a rollback of its master was a one-way door: the journal it
needs was gone. The upgrade first copies the journal, as it is, beside it, named for its
schema version and the moment (``journal.db.v2.20261205T231802Z.bak``), through SQLite's online
backup (what the ``-wal`` holds included, a consistent copy); a copy that cannot be made (a full
disk) stops the upgrade with nothing changed. Every upgrade writes a copy of its own, never over
an older one: after a rollback and a second upgrade, the second copy holds what the older
master journaled in between, and the first is still there. The copy has no open mark
(``journal_opened.py``): it is whole, so put back without a ``-wal`` it opens without a warning.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from troupe.runtime.errors import JournalError

from .journal_opened import mark_closed

__all__ = ["backup_path", "keep_copy_before_upgrade", "kept_copies"]


def backup_path(path: Path, version: int, when: float | None = None) -> Path:
    """A name for a new copy of the journal ``path`` of schema ``version``, made at ``when``
    (now by default): one no file has yet."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if when is None else when))
    target = path.with_name(f"{path.name}.v{version}.{stamp}.bak")
    n = 1
    while target.exists():  # two upgrades in one second
        n += 1
        target = path.with_name(f"{path.name}.v{version}.{stamp}-{n}.bak")
    return target


def kept_copies(path: Path, readable: Callable[[int], bool]) -> list[Path]:
    """The copies :func:`backup_path` named beside the journal ``path`` whose schema version
    ``readable`` takes, oldest first."""
    found = []
    for copy in path.parent.glob(f"{path.name}.v*.bak"):
        version = copy.name[len(path.name) + 2 :].split(".", 1)[0]
        if version.isdigit() and readable(int(version)):
            found.append(copy)
    return sorted(found, key=lambda copy: copy.stat().st_mtime)


def keep_copy_before_upgrade(conn: sqlite3.Connection, path: Path, version: int) -> Path:
    """Copy the journal open on ``conn`` (schema ``version``) to :func:`backup_path`; return it.

    Raises:
        JournalError: the copy could not be written (nothing was changed).
    """
    target = backup_path(path, version)
    partial = target.with_name(target.name + ".partial")
    try:
        with contextlib.closing(sqlite3.connect(partial, isolation_level=None)) as copy:
            conn.backup(copy)
            mark_closed(copy)  # a whole copy, of a journal open now: put back, it opens quietly
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, target)  # whole or not there: never a half copy under the name
    except (OSError, sqlite3.Error) as exc:
        partial.unlink(missing_ok=True)
        raise JournalError(
            f"journal {path} has schema version {version} and this troupe upgrades it, but the "
            f"copy of it kept before the upgrade could not be written to {target} ({exc}); "
            "free space there and start again (nothing was changed)"
        ) from exc
    return target
