"""The master's durable task journal: SQLite in WAL mode, one transaction per ``handle`` call.

The journal stores the book compactly: a ``jobs`` table and a ``tasks`` table, each row updated
in place by the :class:`~troupe.runtime.taskstate.Record` commands the task book returns
(``JobSubmitted`` inserts a job and all its tasks with ``executemany``; ``JobRecord`` and
``TaskRecord`` overwrite a row). :meth:`Journal.replay` reads both tables back into a
:class:`~troupe.runtime.taskbook.TaskBook` (see ``TaskTables.restore`` for what survives a
restart: done stays done, dead stays dead, cancelled stays cancelled, leased comes back pending).

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
queue. Every ``sqlite3`` error is translated to ``JournalError`` here.

A journal object is not safe for concurrent use, but may be handed between threads (the driver
may run :meth:`Journal.append` in a worker thread so the fsync does not block its event loop).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

from .errors import JournalError, TaskError
from .taskbook import TaskBook
from .taskstate import (
    JobPolicy,
    JobRecord,
    JobState,
    JobSubmitted,
    Record,
    Resources,
    Speculation,
    TaskRecord,
    TaskSpec,
    TaskState,
)

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "Journal", "JournalEntry"]

log = structlog.get_logger(__name__)

JournalEntry = Record | JobSubmitted | JobRecord | TaskRecord  # what append() takes

APPLICATION_ID = 0x54525550  # "TRUP" in the SQLite header: marks a file as a troupe journal
SCHEMA_VERSION = 1  # PRAGMA user_version; bump it with every schema change

_SCHEMA = (
    """CREATE TABLE jobs (
        job_id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        seq INTEGER NOT NULL,
        state TEXT NOT NULL,
        policy TEXT NOT NULL,
        submitted_at REAL NOT NULL
    )""",
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
_UPSERT_JOB = (
    "INSERT INTO jobs (job_id, name, seq, state, policy, submitted_at) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job_id) DO UPDATE SET name = excluded.name, seq = excluded.seq, "
    "state = excluded.state, policy = excluded.policy, submitted_at = excluded.submitted_at"
)
_INSERT_TASK = (
    "INSERT INTO tasks (task_id, job_id, kind, seed, refs, cpu, gpu, locality, state, attempts, "
    "not_before, last_lease_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, 0.0, 0)"
)
_UPDATE_TASK = (
    "UPDATE tasks SET state = ?, attempts = ?, not_before = ?, last_lease_id = ?, "
    "result_ref = ?, error = ?, traceback = ? WHERE task_id = ?"
)
_SELECT_TASKS = (
    "SELECT task_id, job_id, kind, seed, refs, cpu, gpu, locality, state, attempts, not_before, "
    "last_lease_id, result_ref, error, traceback FROM tasks ORDER BY seq"
)


class Journal:
    """A durable journal of one master's jobs and tasks. Use :meth:`open`, not the constructor.

    Args:
        conn: an open, checked connection.
        path: where the journal lives.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._path = path

    @classmethod
    def open(cls, path: str | os.PathLike[str], create: bool = False) -> Journal:
        """Open (or, with ``create``, start) the journal at ``path`` and check it.

        Args:
            path: the journal file.
            create: start an empty journal if the file does not exist (or is empty). An existing
                journal is opened as it is, never overwritten.

        Returns:
            The open journal.

        Raises:
            JournalError: the file is missing (and ``create`` is False), is not a SQLite
                database, is not a troupe journal, has another schema version, or fails
                ``PRAGMA quick_check``.
        """
        path = Path(path)
        if not path.exists() and not create:
            raise JournalError(f"journal {path} does not exist; give the path of the existing "
                               "journal, or pass create=True to start a new, empty one")
        if not path.parent.is_dir():
            raise JournalError(f"journal {path}: directory {path.parent} does not exist; "
                               "create it first")
        with _translated(path, "opening"):
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            with _translated(path, "opening"):
                created = _check_or_init(conn, path, create)
                conn.execute("PRAGMA synchronous = FULL")
        except BaseException:
            conn.close()
            raise
        log.info("journal_opened", path=str(path), created=created)
        return cls(conn, path)

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
        conn = self._connection()
        records = list(records)
        if not records:
            return
        with _translated(self._path, "appending"):
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._write(conn, records)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def replay(self) -> TaskBook:
        """Rebuild the task book from the journal, as it was at the last append.

        Returns:
            A book with every job and task; leased tasks are pending again, no workers.

        Raises:
            JournalError: the journal cannot be read or holds rows that make no sense.
        """
        conn = self._connection()
        with _translated(self._path, "replaying"):
            jobs = [
                JobRecord(job_id, name, seq, JobState(state), _policy(policy), submitted_at)
                for job_id, name, seq, state, policy, submitted_at in conn.execute(
                    "SELECT job_id, name, seq, state, policy, submitted_at FROM jobs ORDER BY seq"
                )
            ]
            book = TaskBook.restore(jobs, _task_rows(conn.execute(_SELECT_TASKS)))
        log.info("journal_replayed", path=str(self._path), jobs=len(jobs))
        return book

    def close(self) -> None:
        """Close the journal; further use raises JournalError. Closing twice is fine."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with _translated(self._path, "closing"):
                conn.close()

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

    @staticmethod
    def _write(conn: sqlite3.Connection, records: Iterable[JournalEntry]) -> None:
        updates: list[tuple[object, ...]] = []
        for record in records:
            entry = record.entry if isinstance(record, Record) else record
            if isinstance(entry, TaskRecord):
                updates.append((
                    entry.state.value, entry.attempts, entry.not_before, entry.last_lease_id,
                    entry.result_ref, entry.error, entry.traceback, entry.task_id,
                ))
                continue
            _update_tasks(conn, updates)  # keep the book's order: a job's row before its tasks
            updates = []
            if isinstance(entry, JobSubmitted):
                conn.execute(_UPSERT_JOB, _job_row(entry.job))
                conn.executemany(_INSERT_TASK, _spec_rows(entry.job.job_id, entry.tasks))
            elif isinstance(entry, JobRecord):
                conn.execute(_UPSERT_JOB, _job_row(entry))
            else:
                raise TypeError(f"not a journal record: {entry!r}")
        _update_tasks(conn, updates)


def _check_or_init(conn: sqlite3.Connection, path: Path, create: bool) -> bool:
    """Check an existing journal or start an empty one; return whether it was started."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    created = False
    if app_id == 0 and version == 0 and tables == 0:
        if not create:
            raise JournalError(f"journal {path} is an empty file, not a troupe journal; pass "
                               "create=True to start a journal there")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
        created = True
    elif app_id != APPLICATION_ID:
        raise JournalError(f"journal {path} is a SQLite database of another program "
                           f"(application_id {app_id:#x}), not a troupe journal; check the path")
    elif version != SCHEMA_VERSION:
        raise JournalError(f"journal {path} has schema version {version}, this troupe reads "
                           f"version {SCHEMA_VERSION}; open it with the troupe release that "
                           "wrote it, or start a new journal")
    problems = [str(row[0]).replace("\n", "; ") for row in conn.execute("PRAGMA quick_check(5)")]
    if problems != ["ok"]:
        raise JournalError(f"journal {path} is corrupt (PRAGMA quick_check: "
                           f"{'; '.join(problems)}); restore it from a backup or start a new one")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise JournalError(f"journal {path} cannot use WAL mode (got {mode!r}); put it on a "
                           "local file system")
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
            fix = "the file is not a (healthy) journal; check the path or restore a backup"
        elif "locked" in text or "busy" in text:
            fix = "another process holds the journal; stop it first"
        elif "unable to open" in text or "readonly" in text:
            fix = "check that the path is a writable file"
        elif "full" in text or "I/O" in text:
            fix = "check the disk the journal is on"
        else:
            fix = "restore the journal from a backup or start a new one"
        raise JournalError(f"journal {path}: {action} failed: {text}; {fix}") from exc
    except (TaskError, ValueError, TypeError, KeyError, OverflowError) as exc:
        raise JournalError(f"journal {path}: {action} failed: {exc}; the journal and this "
                           "troupe disagree about its contents") from exc


def _update_tasks(conn: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    if not rows:
        return
    cursor = conn.executemany(_UPDATE_TASK, rows)
    if cursor.rowcount != len(rows):
        raise JournalError(f"{len(rows) - cursor.rowcount} task record(s) name tasks the "
                           "journal does not hold; the journal belongs to another master")


def _job_row(job: JobRecord) -> tuple[object, ...]:
    policy = json.dumps(dataclasses.asdict(job.policy), sort_keys=True)
    return (job.job_id, job.name, job.seq, job.state.value, policy, job.submitted_at)


def _spec_rows(job_id: str, specs: Iterable[TaskSpec]) -> Iterator[tuple[object, ...]]:
    for s in specs:
        refs = json.dumps(dict(s.refs), sort_keys=True) if s.refs else "{}"
        yield (s.task_id, job_id, s.kind, s.seed, refs, s.needs.cpu, s.needs.gpu, s.locality)


def _policy(text: str) -> JobPolicy:
    fields = json.loads(text)
    return JobPolicy(**{**fields, "speculation": Speculation(**fields["speculation"])})


def _task_rows(rows: Iterable[Any]) -> Iterator[tuple[TaskSpec, TaskRecord]]:
    needs_seen: dict[tuple[float, int], Resources] = {}  # one shared object per distinct need
    states = {state.value: state for state in TaskState}  # a dict is 5x faster than TaskState()
    for (task_id, job_id, kind, seed, refs, cpu, gpu, locality, state, attempts, not_before,
         last_lease_id, result_ref, error, traceback) in rows:
        needs = needs_seen.get((cpu, gpu))
        if needs is None:
            needs = needs_seen[(cpu, gpu)] = Resources(cpu, gpu)
        spec = TaskSpec(task_id, kind, seed, json.loads(refs) if refs != "{}" else {}, needs,
                        locality)
        yield spec, TaskRecord(task_id, job_id, states[state], attempts, not_before,
                               last_lease_id, result_ref, error, traceback)
