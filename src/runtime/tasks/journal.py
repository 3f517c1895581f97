"""The master's durable task journal: SQLite in WAL mode, one transaction per ``handle`` call.

The journal stores the book compactly: a ``jobs`` table and a ``tasks`` table, each row updated
in place by the :class:`~troupe.runtime.tasks.state.Record` commands the task book returns
(``JobSubmitted`` inserts a job and all its tasks, with ``executemany`` or, for a big job, in
chunks: ``journal_bulk.py``; ``JobRecord`` and ``TaskRecord`` overwrite a row).
:meth:`Journal.replay` reads both tables back into a :class:`~troupe.runtime.tasks.book.TaskBook`
(see ``TaskTables.restore`` for what survives a restart: done stays done, dead stays dead,
cancelled stays cancelled, leased comes back pending).

Durability: ``journal_mode=WAL`` with ``synchronous=FULL``. Every commit fsyncs the WAL before
:meth:`Journal.append` returns, so a record the driver has appended survives a killed master and
also a power cut or kernel crash. ``NORMAL`` would be durable against a killed process only: after
a power cut the last commits can roll back, and the master would forget a Complete it had already
acknowledged (the task would run again) or a lease it had sent. The price is one fsync per
``handle`` call, which a master handling control traffic can afford; tasks are never written one
transaction each, since a submit or a pull of many slots is a single call.

Opening is strict: a missing file (unless ``create=True``), a file that is not SQLite, a SQLite
file that is not a troupe journal, a schema of another version, or a failing
``PRAGMA quick_check`` raises :class:`~troupe.runtime.errors.JournalError`, never an empty
queue. Every ``sqlite3`` error is translated to ``JournalError`` here. Replay checks every row it
reads (:mod:`troupe.runtime.tasks.journal_check`) and refuses a row of the wrong type, naming it.

One master per journal: an open journal holds an exclusive lock on ``<journal>.lock``
(:mod:`troupe.runtime.tasks.journal_lock`) until it is closed or its process dies; a second open, in
this process or another, raises :class:`~troupe.runtime.tasks.journal_lock.JournalBusy`.

Compaction (:meth:`Journal.compact`) keeps restarts fast: a job that finished (every task done,
dead or cancelled) has its done and cancelled task rows folded into one ``compacted_jobs`` row
of counts. Its dead task rows stay, with their errors, so ``ctl dead`` still lists them. What a
compacted job forgets is its done tasks' ids: a late Complete for one is rejected as an unknown
task (its output is committed already, so nothing is lost), and a new job may reuse such an id;
the output store still holds the old output under that id, so a task actor that checks
``OutputStore.is_committed`` first answers it without running again. Schema version 2 adds
``jobs.finished_at`` and ``compacted_jobs``; a version-1 journal is upgraded when opened.

A journal object is not safe for concurrent use, but may be handed between threads: the master's
driver writes a batch's rows with :meth:`Journal.stage` on its event loop and runs
:meth:`Journal.commit` (the fsync) in a worker thread, so the fsync does not block the loop.
A job of many tasks (``BULK_TASKS`` or more) is the exception: its task rows, and whatever
follows them in the batch, are written by the commit, in the thread, a few thousand rows per
statement (``journal_bulk.py``), so a submit of a million tasks does not hold the loop for the
seconds its rows take.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

from troupe.runtime.errors import JournalDamaged, JournalError, TaskError
from troupe.runtime.gc_pauses import collector_paused

from .book import TaskBook
from .job_digest import job_digest
from .journal_backup import keep_copy_before_upgrade
from .journal_bulk import insert_tasks, is_bulk, refs_text
from .journal_check import bad_row, check_rows
from .journal_lock import JournalLock
from .state import (
    FINAL_STATES,
    JobPolicy,
    JobRecord,
    JobState,
    JobSubmitted,
    JobTasksCancelled,
    Record,
    Resources,
    Speculation,
    TaskRecord,
    TaskSpec,
    TaskState,
)

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "Compaction", "Journal", "JournalEntry"]

log = structlog.get_logger(__name__)

JournalEntry = Record | JobSubmitted | JobRecord | TaskRecord | JobTasksCancelled  # what append() takes

APPLICATION_ID = 0x54525550  # "TRUP" in the SQLite header: marks a file as a troupe journal
REPLAY_NOTE_S = 5.0  # a long replay says how far it got this often
SCHEMA_VERSION = 3  # PRAGMA user_version; bump it with every schema change
_UPGRADABLE = (1, 2)  # older versions opened and upgraded in place

_COMPACTED_TABLE = """CREATE TABLE compacted_jobs (
        job_id TEXT PRIMARY KEY REFERENCES jobs (job_id),
        done INTEGER NOT NULL,
        cancelled INTEGER NOT NULL,
        last_lease_id INTEGER NOT NULL,
        compacted_at REAL NOT NULL,
        content TEXT
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
)
_UPGRADE_FROM_1 = (
    "ALTER TABLE jobs ADD COLUMN finished_at REAL",
    _COMPACTED_TABLE,
    # when they finished is unknown: count from the upgrade, so none is compacted at once
    "UPDATE jobs SET finished_at = :now WHERE state != 'running'",
)
# A compacted job's tasks' digest (job_digest), for a submit of it again; null: compacted before.
_UPGRADE_FROM_2 = ("ALTER TABLE compacted_jobs ADD COLUMN content TEXT",)
_UPSERT_JOB = (  # a job keeps the time it first finished
    "INSERT INTO jobs (job_id, name, seq, state, policy, submitted_at, finished_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job_id) DO UPDATE SET name = excluded.name, seq = excluded.seq, "
    "state = excluded.state, policy = excluded.policy, submitted_at = excluded.submitted_at, "
    "finished_at = CASE WHEN excluded.finished_at IS NULL THEN NULL "
    "ELSE coalesce(jobs.finished_at, excluded.finished_at) END"
)
_FOLDED = "('done', 'cancelled')"  # task states whose rows compaction folds into counts
_COMPACTABLE = (
    "SELECT job_id FROM jobs WHERE state != 'running' AND finished_at <= :before "
    "AND job_id NOT IN (SELECT job_id FROM compacted_jobs)"
)
_INSERT_TASK = (
    "INSERT INTO tasks (task_id, job_id, kind, seed, refs, cpu, gpu, locality, state, attempts, "
    "not_before, last_lease_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, 0.0, 0)"
)
_LIVE = tuple(s.value for s in TaskState if s not in FINAL_STATES)  # a task's states until it ends
_CANCEL_TASKS = (
    "UPDATE tasks SET state = ? WHERE job_id = ? AND seq BETWEEN "
    "(SELECT seq FROM tasks WHERE task_id = ?) AND (SELECT seq FROM tasks WHERE task_id = ?) "
    f"AND state IN ({', '.join('?' * len(_LIVE))})"
)
_UPDATE_TASK = (
    "UPDATE tasks SET state = ?, attempts = ?, not_before = ?, last_lease_id = ?, "
    "result_ref = ?, error = ?, traceback = ? WHERE task_id = ?"
)
_TASK_COLUMNS = (
    "task_id, job_id, kind, seed, refs, cpu, gpu, locality, state, attempts, not_before, "
    "last_lease_id, result_ref, error, traceback"
)
_SELECT_TASKS = f"SELECT {_TASK_COLUMNS} FROM tasks ORDER BY seq"
_SELECT_JOB_TASKS = f"SELECT {_TASK_COLUMNS} FROM tasks WHERE job_id = ? ORDER BY seq"


@dataclasses.dataclass(frozen=True, slots=True)
class Compaction:
    """What :meth:`Journal.compact` did.

    Attributes:
        jobs: finished jobs compacted now.
        task_rows: task rows removed (folded into the jobs' counts).
    """

    jobs: int
    task_rows: int


class Journal:
    """A durable journal of one master's jobs and tasks. Use :meth:`open`, not the constructor.

    Args:
        conn: an open, checked connection.
        path: where the journal lives.
        lock: the journal's lock, held by this object and released by :meth:`close`.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, lock: JournalLock | None = None) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._path = path
        self._lock = lock
        self._checked = False  # rows checked once: nothing but this object writes while locked
        self._later: list[JournalEntry] = []  # staged records the commit writes (see stage)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        create: bool = False,
        new_hint: str = "pass create=True to start a new journal there",
    ) -> Journal:
        """Open (or, with ``create``, start) the journal at ``path`` and check it.

        A refused file is left as it was, its ``-wal`` too: it is checked through a read-only
        connection first (which may rebuild the ``-shm``, the WAL's index, as any reader does).

        Args:
            path: the journal file.
            create: start an empty journal if the file does not exist (or is empty). An existing
                journal is opened as it is, never overwritten.
            new_hint: how the caller asks for ``create``, said when a missing or empty file is
                refused without it (the CLI: ``pass --new ...``).

        Returns:
            The open journal.

        Raises:
            JournalBusy: another process (or another open journal object) holds the journal.
            JournalError: the file is missing (and ``create`` is False), is not a SQLite
                database, is not a troupe journal, has another schema version, or fails
                ``PRAGMA quick_check``.
        """
        path = Path(path)
        if not path.exists() and not create:
            raise JournalError(
                f"journal {path} does not exist; give the path of the existing journal, or {new_hint}"
            )
        if not path.parent.is_dir():
            if path.parent.exists():
                raise JournalError(f"journal {path}: {path.parent} is a file, not a directory")
            raise JournalError(f"journal {path}: directory {path.parent} does not exist; create it first")
        if path.exists() and not path.is_file():
            raise JournalError(f"journal {path} is not a regular file; give the path of a journal file")
        with _translated(path, "opening"):
            _refuse_foreign(path)  # before the lock: it leaves no lock file beside another's file
        lock = JournalLock.acquire(path)  # before SQLite touches the file: it may create it
        try:
            _refuse_empty(path, create, new_hint)
            with _translated(path, "opening"):
                _refuse_damaged(path)
                conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except BaseException:
            lock.release()
            raise
        try:
            with _translated(path, "opening"):
                created = _check_or_init(conn, path, create, new_hint)
                conn.execute("PRAGMA synchronous = FULL")
        except BaseException:
            conn.close()
            lock.release()
            raise
        log.info("journal_opened", path=str(path), created=created)
        return cls(conn, path, lock)

    @property
    def path(self) -> Path:
        """Where the journal lives."""
        return self._path

    def append(self, records: Iterable[JournalEntry]) -> None:
        """Write the records of one ``handle`` call in ONE durable transaction.

        Args:
            records: Record commands (or their entries), in the order the book returned them.

        Raises:
            JournalError: the write failed (nothing of it is kept), or a record names a task
                the journal does not hold.
        """
        if self.stage(records):
            self.commit()

    def stage(self, records: Iterable[JournalEntry]) -> bool:
        """Write the records of one batch in a transaction left open: :meth:`commit` makes
        them durable, :meth:`rollback` drops them; until then nothing else may use the journal.

        The master's driver stages a batch on its event loop (rows are cheap) and commits in a
        thread (the fsync releases the GIL): a thread that wrote row by row would take the GIL
        back from the busy loop for each row, and a batch's replies would wait for every hand-over.
        Rows are not cheap by the million: from the first job of ``BULK_TASKS`` or more tasks on,
        the records are kept for :meth:`commit`, which inserts that job's tasks a few thousand
        rows per statement, the GIL free while SQLite works (``journal_bulk.py``).

        Args:
            records: Record commands (or their entries), in the order the book returned them.

        Returns:
            Whether a transaction was opened (False: no records, nothing to commit).

        Raises:
            JournalError: the write failed (nothing of it is kept), or a record names a task
                the journal does not hold.
        """
        conn = self._connection()
        records = list(records)
        if not records:
            return False
        now, later = _split_at_bulk(records)
        with _translated(self._path, "appending"):
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._write(conn, now)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        self._later = later
        return True

    def commit(self) -> None:
        """Make the staged records durable, in one fsync (see :meth:`stage`).

        Raises:
            JournalError: the commit failed; nothing of the staged records is kept.
        """
        conn = self._connection()
        later, self._later = self._later, []
        with _translated(self._path, "appending"):
            try:
                self._write(conn, later)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def rollback(self) -> None:
        """Drop the staged records, if a transaction is open."""
        conn = self._connection()
        self._later = []
        if conn.in_transaction:
            with _translated(self._path, "rolling back"):
                conn.execute("ROLLBACK")

    def replay(self, note_s: float = REPLAY_NOTE_S) -> TaskBook:
        """Rebuild the task book from the journal, as it was at the last append.

        Args:
            note_s: seconds between the ``journal_replaying`` lines of a long replay.

        Returns:
            A book with every job and task; leased tasks are pending again, no workers.

        Raises:
            JournalError: the journal cannot be read or holds rows that make no sense; a row of
                the wrong type or shape is named (table, row id, column, value).
        """
        conn = self._connection()
        with _translated(self._path, "replaying"):
            self._check(conn)
            jobs = [
                JobRecord(job_id, name, seq, JobState(state), _policy(policy), submitted_at)
                for job_id, name, seq, state, policy, submitted_at in conn.execute(
                    "SELECT job_id, name, seq, state, policy, submitted_at FROM jobs ORDER BY seq"
                )
            ]
            compacted, lease_floor, digests = {}, 0, {}
            for job_id, done, cancelled, last_lease_id, content in conn.execute(
                "SELECT job_id, done, cancelled, last_lease_id, content FROM compacted_jobs"
            ):
                compacted[job_id] = {TaskState.DONE: done, TaskState.CANCELLED: cancelled}
                lease_floor = max(lease_floor, last_lease_id)
                if content is not None:
                    digests[job_id] = content
            started = time.monotonic()
            total = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
            rows = _noted(_task_rows(conn.execute(_SELECT_TASKS)), total, self._path, note_s)
            with collector_paused():  # a few objects a task, all kept (see gc_pauses)
                book = TaskBook.restore(jobs, rows, compacted, lease_floor, digests)
        log.info(
            "journal_replayed",
            path=str(self._path),
            jobs=len(jobs),
            compacted_jobs=len(compacted),
            tasks=total,
            took_s=round(time.monotonic() - started, 3),
        )
        return book

    def compact(self, finished_before: float) -> Compaction:
        """Fold the task rows of jobs that finished before a time into per-job counts.

        Done and cancelled task rows of each such job are deleted and counted in one
        ``compacted_jobs`` row; dead task rows stay (``ctl dead`` lists them with their
        errors). A replay then reads one row per compacted job instead of one per task. One
        transaction: a failure keeps nothing of it.

        Args:
            finished_before: compact jobs whose ``finished_at`` (epoch seconds) is at or
                before this; ``time.time()`` compacts every finished job.

        Returns:
            How many jobs were compacted and task rows removed.

        Raises:
            JournalError: the journal holds a bad row (nothing is changed), or the write failed.
        """
        conn = self._connection()
        with _translated(self._path, "compacting"):
            self._check(conn)
            conn.execute("BEGIN IMMEDIATE")
            try:
                now = time.time()
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS compacting (job_id TEXT PRIMARY KEY)")
                conn.execute("DELETE FROM compacting")
                conn.execute(f"INSERT INTO compacting {_COMPACTABLE}", {"before": finished_before})
                counts = dict.fromkeys(
                    (row[0] for row in conn.execute("SELECT job_id FROM compacting")), (0, 0, 0)
                )
                for job_id, done, cancelled, last_lease_id in conn.execute(
                    "SELECT job_id, sum(state = 'done'), sum(state = 'cancelled'), "
                    f"max(last_lease_id) FROM tasks WHERE state IN {_FOLDED} "
                    "AND job_id IN (SELECT job_id FROM compacting) GROUP BY job_id"
                ):
                    counts[job_id] = (done, cancelled, last_lease_id)
                # Every task the job had, in submit order: a submit of it again is compared by this.
                digests = {job_id: _job_digest(conn, job_id) for job_id in counts}
                conn.executemany(  # the lease ids are kept: new leases go on above them
                    "INSERT INTO compacted_jobs (job_id, done, cancelled, last_lease_id, "
                    "compacted_at, content) VALUES (?, ?, ?, ?, ?, ?)",
                    [(job_id, *row, now, digests[job_id]) for job_id, row in counts.items()],
                )
                removed = conn.execute(
                    f"DELETE FROM tasks WHERE state IN {_FOLDED} AND job_id IN "
                    "(SELECT job_id FROM compacting)"
                ).rowcount
                conn.execute("DELETE FROM compacting")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        if counts:
            log.info("journal_compacted", path=str(self._path), jobs=len(counts), task_rows=removed)
        return Compaction(len(counts), removed)

    def close(self) -> None:
        """Close the journal and free its lock; further use raises JournalError. Closing twice
        is fine."""
        try:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                with _translated(self._path, "closing"):
                    conn.close()
        finally:
            if self._lock is not None:
                self._lock.release()

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise JournalError(f"journal {self._path} is closed; open it again")
        return self._conn

    def _check(self, conn: sqlite3.Connection) -> None:
        """Refuse the journal if a row has the wrong shape (once: then only we write to it)."""
        if self._checked:
            return
        check_rows(conn, self._path, ["jobs", "tasks", "compacted_jobs"])
        for rowid, policy in conn.execute("SELECT rowid, policy FROM jobs ORDER BY rowid"):
            try:
                _policy(policy)
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                raise bad_row(conn, self._path, "jobs", rowid, "policy", f"a job policy ({exc})") from None
        self._checked = True

    @staticmethod
    def _write(conn: sqlite3.Connection, records: Iterable[JournalEntry]) -> None:
        updates: list[tuple[object, ...]] = []
        for record in records:
            entry = record.entry if isinstance(record, Record) else record
            if isinstance(entry, TaskRecord):
                updates.append(
                    (
                        entry.state.value,
                        entry.attempts,
                        entry.not_before,
                        entry.last_lease_id,
                        entry.result_ref,
                        entry.error,
                        entry.traceback,
                        entry.task_id,
                    )
                )
                continue
            _update_tasks(conn, updates)  # keep the book's order: a job's row before its tasks
            updates = []
            if isinstance(entry, JobSubmitted):
                conn.execute(_UPSERT_JOB, _job_row(entry.job))
                if is_bulk(entry.tasks):
                    insert_tasks(conn, entry.job.job_id, entry.tasks)
                else:
                    conn.executemany(_INSERT_TASK, _spec_rows(entry.job.job_id, entry.tasks))
            elif isinstance(entry, JobRecord):
                conn.execute(_UPSERT_JOB, _job_row(entry))
            elif isinstance(entry, JobTasksCancelled):
                _cancel_tasks(conn, entry)
            else:
                raise TypeError(f"not a journal record: {entry!r}")
        _update_tasks(conn, updates)


def _job_digest(conn: sqlite3.Connection, job_id: str) -> str:
    return job_digest(spec for spec, _ in _task_rows(conn.execute(_SELECT_JOB_TASKS, (job_id,))))


def _refuse_empty(path: Path, create: bool, new_hint: str) -> None:
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
    try:
        wal_size = os.stat(f"{path}-wal").st_size
    except OSError:
        wal_size = 0
    if wal_size > 0:
        raise JournalError(
            f"journal {path} is an empty file beside a {wal_size}-byte {path.name}-wal that may hold its "
            "records; restore the journal from a backup, or move both away to start a new one "
            "(nothing was changed)"
        )
    if not create:
        raise JournalError(f"journal {path} is an empty file, not a troupe journal; {new_hint}")


def _refuse_foreign(path: Path) -> None:
    """Refuse, through a read-only connection, a database of another program or a journal of a
    schema version this troupe does not read. A read-write connection refused them too, but its
    close folded the file's ``-wal`` into the database and deleted it: the files of another
    program, or of another troupe release, changed under them."""
    with _read_only(path) as probe:
        if probe is not None:
            app_id, version, tables = _identity(probe)
            if app_id or version or tables:  # an empty database: ``_check_or_init`` decides
                _refuse_other(path, app_id, version)


def _refuse_damaged(path: Path) -> None:
    """Refuse, read-only as ``_refuse_foreign``, a journal that fails ``PRAGMA quick_check``."""
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
    read (no file, or an empty one: ``_refuse_empty`` decides about those without SQLite,
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
            f"versions {_UPGRADABLE[0]} to {SCHEMA_VERSION}; open it with the "
            "troupe release that wrote it, or start a new journal (nothing was changed)"
        )


def _check_or_init(conn: sqlite3.Connection, path: Path, create: bool, new_hint: str) -> bool:
    """Check an existing journal or start an empty one; return whether it was started."""
    app_id, version, tables = _identity(conn)
    created = False
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
        # Checked read-only already (``_refuse_foreign``); again here, on what this connection
        # sees, before it writes: the file may have been replaced in between.
        _refuse_other(path, app_id, version)
        if version in _UPGRADABLE:
            kept = keep_copy_before_upgrade(conn, path, version)  # an older master reads it
            conn.execute("BEGIN IMMEDIATE")
            for statement in _UPGRADE_FROM_1 if version == 1 else _UPGRADE_FROM_2:
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
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise JournalError(
            f"journal {path} cannot use WAL mode (got {mode!r}); put it on a local file system"
        )
    return created


@contextmanager
def _translated(path: Path, action: str) -> Iterator[None]:
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
            fix = (
                f"free space on the disk the journal is on (df {path.parent}), then start again: "
                "what was recorded stays"
            )
        elif "I/O" in text:
            fix = "check the disk the journal is on"
        else:
            fix = "restore the journal from a backup or start a new one"
        raise JournalError(f"journal {path}: {action} failed: {text}; {fix}") from exc
    except (TaskError, ValueError, TypeError, KeyError, OverflowError) as exc:
        raise JournalError(
            f"journal {path}: {action} failed: {exc}; the journal and this troupe disagree about its contents"
        ) from exc


def _update_tasks(conn: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    if not rows:
        return
    cursor = conn.executemany(_UPDATE_TASK, rows)
    if cursor.rowcount != len(rows):
        raise JournalError(
            f"{len(rows) - cursor.rowcount} task record(s) name tasks the "
            "journal does not hold; the journal belongs to another master"
        )


def _split_at_bulk(records: list[JournalEntry]) -> tuple[list[JournalEntry], list[JournalEntry]]:
    """The records before the first job of ``BULK_TASKS`` or more tasks, or the first big
    job's cancelled tasks, and the rest (from that record on, in order: a later record may
    name one of its tasks)."""
    for i, record in enumerate(records):
        entry = record.entry if isinstance(record, Record) else record
        if (isinstance(entry, JobSubmitted) and is_bulk(entry.tasks)) or isinstance(entry, JobTasksCancelled):
            return records[:i], records[i:]
    return records, []


def _cancel_tasks(conn: sqlite3.Connection, entry: JobTasksCancelled) -> None:
    """One statement for a big job's cancelled tasks: its rows are contiguous (a job's tasks
    are inserted together), found by their first and last ids."""
    cursor = conn.execute(
        _CANCEL_TASKS,
        (TaskState.CANCELLED.value, entry.job_id, entry.first_task_id, entry.last_task_id, *_LIVE),
    )
    if cursor.rowcount != entry.count:
        raise JournalError(
            f"job {entry.job_id!r}: {entry.count} tasks were cancelled but the journal holds "
            f"{cursor.rowcount} of them not final; the journal belongs to another master"
        )


def _job_row(job: JobRecord) -> tuple[object, ...]:
    policy = json.dumps(dataclasses.asdict(job.policy), sort_keys=True)
    finished_at = None if job.state is JobState.RUNNING else time.time()
    return (job.job_id, job.name, job.seq, job.state.value, policy, job.submitted_at, finished_at)


def _spec_rows(job_id: str, specs: Iterable[TaskSpec]) -> Iterator[tuple[object, ...]]:
    for s in specs:
        yield (s.task_id, job_id, s.kind, s.seed, refs_text(s), s.needs.cpu, s.needs.gpu, s.locality)


def _policy(text: str) -> JobPolicy:
    fields = json.loads(text)
    return JobPolicy(**{**fields, "speculation": Speculation(**fields["speculation"])})


def _noted(rows: Iterator[Any], total: int, path: Path, every_s: float) -> Iterator[Any]:
    """``rows``, with a ``journal_replaying`` line every ``every_s`` seconds: a million tasks
    take the master many seconds to read back, and its log would say nothing meanwhile."""
    start = time.monotonic()
    due = start + every_s
    for n, row in enumerate(rows, 1):
        yield row
        if not n & 1023 and time.monotonic() >= due:  # the clock read once per 1,024 rows
            now = time.monotonic()
            log.info("journal_replaying", path=str(path), tasks=n, of=total, elapsed_s=round(now - start, 1))
            due = now + every_s


def _task_rows(rows: Iterable[Any]) -> Iterator[tuple[TaskSpec, TaskRecord]]:
    needs_seen: dict[tuple[float, int], Resources] = {}  # one shared object per distinct need
    states = {state.value: state for state in TaskState}  # a dict is 5x faster than TaskState()
    for (
        task_id,
        job_id,
        kind,
        seed,
        refs,
        cpu,
        gpu,
        locality,
        state,
        attempts,
        not_before,
        last_lease_id,
        result_ref,
        error,
        traceback,
    ) in rows:
        needs = needs_seen.get((cpu, gpu))
        if needs is None:
            needs = needs_seen[(cpu, gpu)] = Resources(cpu, gpu)
        spec = TaskSpec(task_id, kind, seed, json.loads(refs) if refs != "{}" else {}, needs, locality)
        yield (
            spec,
            TaskRecord(
                task_id,
                job_id,
                states[state],
                attempts,
                not_before,
                last_lease_id,
                result_ref,
                error,
                traceback,
            ),
        )
