"""The copy of a journal a master keeps before it upgrades the journal's schema.

A master of a newer troupe rewrites an older journal to its schema as it opens it, and a master
of the older troupe refuses the result (``journal ... has schema version N``). A cluster is
upgraded a host at a time, and a rollback of its master was a one-way door: the journal it
needs was gone. The upgrade first copies the journal, as it is, beside it
(``journal.db.v2.bak`` for schema version 2), through SQLite's online backup (what the ``-wal``
holds included, a consistent copy); a copy that cannot be made (a full disk) stops the upgrade
with nothing changed. A copy that is there already (an earlier upgrade of the same version that
did not finish) is kept: it is the same journal.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from troupe.runtime.errors import JournalError

__all__ = ["backup_path", "keep_copy_before_upgrade"]


def backup_path(path: Path, version: int) -> Path:
    """Where the copy of the journal ``path`` of schema ``version`` lies."""
    return path.with_name(f"{path.name}.v{version}.bak")


def keep_copy_before_upgrade(conn: sqlite3.Connection, path: Path, version: int) -> Path:
    """Copy the journal open on ``conn`` (schema ``version``) to :func:`backup_path`; return it.

    Raises:
        JournalError: the copy could not be written (nothing was changed).
    """
    target = backup_path(path, version)
    if target.exists():
        return target
    partial = target.with_name(target.name + ".partial")
    try:
        with contextlib.closing(sqlite3.connect(partial)) as copy:
            conn.backup(copy)
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
