"""The journal's schema, and the checks that open a file as a journal of it (or start one).

A journal is opened in steps, all strict (see :meth:`troupe.runtime.tasks.journal.Journal.open`):
:func:`refuse_foreign` and :func:`refuse_damaged` read the file through a read-only connection,
so a refused file and its ``-wal`` are left as they were; :func:`refuse_empty` looks at an empty
file without SQLite (which would delete the ``-wal`` beside it); :func:`check_or_init` checks
what the read-write connection sees, starts an empty journal, or upgrades an older schema in
place (after :func:`~troupe.runtime.tasks.journal_backup.keep_copy_before_upgrade`). Apart from
``journal.py`` because none of it is about the rows a master reads and writes once it is open.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from troupe.runtime.errors import JournalDamaged, JournalError
from troupe.runtime.library_logging import get_logger

from .journal_backup import keep_copy_before_upgrade, kept_copies
from .journal_opened import wal_bytes

__all__ = [
    "APPLICATION_ID",
    "SCHEMA_VERSION",
    "Upgraded",
    "check_or_init",
    "refuse_damaged",
    "refuse_empty",
    "refuse_foreign",
]

log = get_logger(__name__)

APPLICATION_ID = 0x54525550  # "TRUP" in the SQLite header: marks a file as a troupe journal
SCHEMA_VERSION = 4  # PRAGMA user_version; bump it with every schema change
_UPGRADABLE = (1, 2, 3)  # older versions opened and upgraded in place

_COMPACTED_TABLE = """CREATE TABLE compacted_jobs (
        job_id TEXT PRIMARY KEY REFERENCES jobs (job_id),
        done INTEGER NOT NULL,
        cancelled INTEGER NOT NULL,
        last_lease_id INTEGER NOT NULL,
        compacted_at REAL NOT NULL,
        content TEXT
    )"""
# A compacted job's done and cancelled task ids that its job id does not account for
# (``compacted_ids.py``): still taken, so that no new job reuses one. Filled by the compaction's
# transaction; rowid only (no index: the book holds them in a dict), about the ids' bytes a row.
_COMPACTED_IDS_TABLE = """CREATE TABLE IF NOT EXISTS compacted_task_ids (
        task_id TEXT NOT NULL,
        job_id TEXT NOT NULL REFERENCES jobs (job_id)
    )"""
_SCHEMA = (
    """CREATE TABLE jobs (
        job_id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        seq INTEGER NOT NULL,
        state TEXT NOT NULL,
        policy TEXT NOT NULL,
        submitted_at REAL NOT NULL,
        finished_at REAL
    )""",
    _COMPACTED_TABLE,
    """CREATE TABLE tasks (
        seq INTEGER PRIMARY KEY,
        task_id TEXT NOT NULL UNIQUE,
        job_id TEXT NOT NULL REFERENCES jobs (job_id),
        kind TEXT NOT NULL,
        seed INTEGER NOT NULL,
        refs TEXT NOT NULL,
        cpu REAL NOT NULL,
        gpu INTEGER NOT NULL,
        locality TEXT,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        not_before REAL NOT NULL,
        last_lease_id INTEGER NOT NULL,
        result_ref TEXT,
        error TEXT,
        traceback TEXT
    )""",
    _COMPACTED_IDS_TABLE,
)
_UPGRADE_FROM_1 = (
    "ALTER TABLE jobs ADD COLUMN finished_at REAL",
    _COMPACTED_TABLE,
    # when they finished is unknown: count from the upgrade, so none is compacted at once
    "UPDATE jobs SET finished_at = :now WHERE state != 'running'",
)
# A compacted job's tasks' digest (job_digest), for a submit of it again; null: compacted before.
_UPGRADE_FROM_2 = ("ALTER TABLE compacted_jobs ADD COLUMN content TEXT",)
# The ids of jobs compacted before are gone: their generated ids stay taken (their job ids do).
_UPGRADE_FROM_3 = (_COMPACTED_IDS_TABLE,)
_UPGRADES = {
    1: _UPGRADE_FROM_1 + _UPGRADE_FROM_3,  # version 1's compacted_jobs is made with content
    2: _UPGRADE_FROM_2 + _UPGRADE_FROM_3,
    3: _UPGRADE_FROM_3,
}


def refuse_empty(path: Path, create: bool, new_hint: str) -> None:
    """Refuse an empty journal file before SQLite opens it: SQLite deletes the ``-wal`` file
    beside an empty database as it opens it, and that WAL may hold every record of a journal
    whose main file was truncated."""
    try:
        if path.stat().st_size != 0:
            return
    except FileNotFoundError:
        return  # a journal to create: SQLite starts the file
    except OSError as exc:
        raise JournalError(f"journal {path}: cannot read it ({exc.strerror or exc}); check the path") from exc
    wal_size = wal_bytes(path)
    if wal_size > 0:
        raise JournalError(
            f"journal {path} is an empty file beside a {wal_size}-byte {path.name}-wal that may hold its "
            "records; restore the journal from a backup, or move both away to start a new one "
            "(nothing was changed)"
        )
    if not create:
        raise JournalError(f"journal {path} is an empty file, not a troupe journal; {new_hint}")


def refuse_foreign(path: Path) -> None:
    """Refuse, through a read-only connection, a database of another program or a journal of a
    schema version this troupe does not read. A read-write connection refused them too, but its
    close folded the file's ``-wal`` into the database and deleted it: the files of another
    program, or of another troupe release, changed under them."""
    with _read_only(path) as probe:
        if probe is not None:
            app_id, version, tables = _identity(probe)
            if app_id or version or tables:  # an empty database: ``check_or_init`` decides
                _refuse_other(path, app_id, version)


def refuse_damaged(path: Path) -> None:
    """Refuse, read-only as ``refuse_foreign``, a journal that fails ``PRAGMA quick_check``."""
    with _read_only(path) as probe:
        if probe is None:
            return
        problems = [str(row[0]).replace("\n", "; ") for row in probe.execute("PRAGMA quick_check(5)")]
    if problems != ["ok"]:
        first = problems[0] if len(problems[0]) <= 160 else problems[0][:157] + "..."
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise JournalDamaged(
            f"journal {path} is corrupt (PRAGMA quick_check: {first}{more}); restore it from a "
            "backup or start a new one (nothing was changed)",
            reason=f"PRAGMA quick_check: {first}{more}",
        )


@contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection to the journal at ``path``; None where there is no database to
    read (no file, or an empty one: ``refuse_empty`` decides about those without SQLite,
    which deletes the ``-wal`` beside an empty database as it opens it)."""
    try:
        if path.stat().st_size == 0:
            yield None
            return
    except FileNotFoundError:
        yield None
        return
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        yield conn
    finally:
        conn.close()


def _identity(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """The database's application id, schema version and count of schema objects."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    return int(app_id), int(version), int(tables)


def _refuse_other(path: Path, app_id: int, version: int) -> None:
    """Refuse a database of another program, or a journal of a schema version not read here."""
    if app_id != APPLICATION_ID:
        raise JournalError(
            f"journal {path} is a SQLite database of another program "
            f"(application_id {app_id:#x}), not a troupe journal; check the path (nothing was changed)"
        )
    if version not in _UPGRADABLE and version != SCHEMA_VERSION:
        raise JournalError(
            f"journal {path} has schema version {version}, this troupe reads "
            f"versions {_UPGRADABLE[0]} to {SCHEMA_VERSION}; {_what_to_do(path, version)} "
            "(nothing was changed)"
        )


def _what_to_do(path: Path, version: int) -> str:
    """What the user of a journal of a schema not read here can do. Every checkout says one
    version (``troupe 0.1.0``), so "the release that wrote it" named nothing they could find; a
    newer troupe's upgrade kept the journal as it was beside it, which this troupe reads (README,
    "Upgrading a cluster": going back loses what was journaled since): report mv 2."""
    if version < _UPGRADABLE[0]:
        return "open it with the troupe that wrote it, or start a new journal"
    kept = kept_copies(path, lambda v: v in _UPGRADABLE or v == SCHEMA_VERSION)
    if not kept:
        return (
            "a newer troupe wrote it: open it with that troupe (`troupe --version` names its code), "
            "or start a new journal"
        )
    return (
        "a newer troupe wrote it: open it with that troupe (`troupe --version` names its code), or, to "
        f"go on with this one, put back the copy its upgrade kept, {kept[-1].name}, as {path.name} (and "
        f'remove {path.name}-wal and -shm): what was journaled since is lost (README, "Upgrading a cluster")'
    )


@dataclass(frozen=True, slots=True)
class Upgraded:
    """A journal of an older schema, upgraded to this troupe's as it was opened.

    Attributes:
        from_version: its schema version before.
        copy: the journal as it was, kept beside it for the troupe that wrote it
            (``journal_backup``): the user is told where, as it stays until removed.
    """

    from_version: int
    copy: Path

    def said(self, journal: str, path: Path, put_back: str) -> str:
        """The upgrade in words: ``journal`` names it (``the run's journal``), ``path`` is its
        file, ``put_back`` what the copy put back as that file does."""
        return (
            f"{journal} {path} was an older troupe's (schema version {self.from_version}) and is "
            f"upgraded for this one; a copy as it was is kept in {self.copy} (put back as "
            f"{path.name}, {put_back})"
        )


def check_or_init(
    conn: sqlite3.Connection, path: Path, create: bool, new_hint: str
) -> tuple[bool, Upgraded | None]:
    """Check an existing journal or start an empty one, upgrading an older schema; return
    whether it was started, and its upgrade (None: none was needed)."""
    app_id, version, tables = _identity(conn)
    created = False
    upgraded = None
    if app_id == 0 and version == 0 and tables == 0:
        if not create:
            raise JournalError(f"journal {path} is an empty database, not a troupe journal; {new_hint}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
        created = True
    else:
        # Checked read-only already (``refuse_foreign``); again here, on what this connection
        # sees, before it writes: the file may have been replaced in between.
        _refuse_other(path, app_id, version)
        if version in _UPGRADABLE:
            kept = keep_copy_before_upgrade(conn, path, version)  # an older master reads it
            conn.execute("BEGIN IMMEDIATE")
            for statement in _UPGRADES[version]:
                conn.execute(statement, {"now": time.time()} if ":now" in statement else ())
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
            log.warning(
                "journal_upgraded",
                path=str(path),
                from_version=version,
                to_version=SCHEMA_VERSION,
                copy_before=str(kept),
            )
            upgraded = Upgraded(version, kept)
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise JournalError(
            f"journal {path} cannot use WAL mode (got {mode!r}); put it on a local file system"
        )
    return created, upgraded
