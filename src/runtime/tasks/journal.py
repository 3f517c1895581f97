"""The master's durable task journal: SQLite in WAL mode, one transaction per ``handle`` call.

The journal stores the book compactly: a ``jobs`` table and a ``tasks`` table, each row updated
in place by the :class:`~troupe.runtime.tasks.state.Record` commands the task book returns
(``JobSubmitted`` inserts a job and all its tasks, with ``executemany`` or, for a big job, in
chunks: ``journal_bulk.py``; ``JobRecord`` and ``TaskRecord`` overwrite a row).
:meth:`Journal.replay` reads both tables back into a :class:`~troupe.runtime.tasks.book.TaskBook`
(see ``TaskTables.restore`` for what survives a restart: done stays done, dead stays dead,
cancelled stays cancelled, leased stays leased under its last lease, for its holder to renew).

Durability: ``journal_mode=WAL`` with ``synchronous=FULL``, the log checkpointed and cut back
often enough that its size is bounded (``journal_wal.py``). Every commit fsyncs the WAL before
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

One master per journal: an open journal holds an exclusive lock on ``<journal>.lock`` and on the
file itself (:mod:`troupe.runtime.tasks.journal_lock`) until it is closed or its process dies; a
second open, in this process or another, by any path to the file (a symlink, a hard link), raises
:class:`~troupe.runtime.tasks.journal_lock.JournalBusy`.

Compaction (:meth:`Journal.compact`) keeps restarts fast: a job that finished (every task done,
dead or cancelled) has its done and cancelled task rows folded into one ``compacted_jobs`` row
of counts. The job's dead task rows stay, with their errors, so ``ctl dead`` still lists them.
What a compacted job forgets is its done tasks' rows: a late Complete for one is rejected as an
unknown task (its output is committed already, so nothing is lost). Their ids stay taken: the
output store holds the old output under each, and a new job that reused one was "done" at once
with it, so ids other than the job's own generated ones are kept in ``compacted_task_ids``
(``compacted_ids.py``) and a submit that reuses one is refused. Schema version 2 adds
``jobs.finished_at`` and ``compacted_jobs``, version 3 ``compacted_jobs.content``, version 4
``compacted_task_ids``; an older journal is upgraded when opened. A
master compacts as it starts (``master/journal_open.py``) and, while it runs, every few minutes,
its book with its journal (``master/compaction.py``: the digests come from the book, and the
journal's transaction runs between two of the driver's batches).

A journal object is not safe for concurrent use, but may be handed between threads: the master's
driver writes a batch's rows with :meth:`Journal.stage` on its event loop and runs
:meth:`Journal.commit` (the fsync) in a worker thread, so the fsync does not block the loop.
A job of many tasks (``BULK_TASKS`` or more) is the exception: its task rows, and whatever
follows them in the batch, are written by the commit, in the thread, a few thousand rows per
statement (``journal_bulk.py``), so a submit of a million tasks does not hold the loop for the
seconds its rows take.

Kept apart, each for one part of this: ``journal_schema.py`` (the schema, and the checks that
open a file as a journal of it or start one), ``journal_write.py`` (the statements a batch of
records becomes), ``journal_rows.py`` (the rows read back, for replay and compaction) and
``journal_errors.py`` (``sqlite3`` errors turned into ``JournalError`` with a fix).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

from troupe.runtime.errors import JournalError
from troupe.runtime.gc_pauses import collector_paused
from troupe.runtime.library_logging import get_logger

from .book import TaskBook
from .compacted_ids import KEPT_ONE_BY_ONE_SQL
from .journal_check import bad_row, check_rows
from .journal_errors import translated
from .journal_lock import JournalLock, lock_path
from .journal_opened import LeftOpen, left_open, mark_closed, mark_open, refuse_orphaned_wal, wal_bytes
from .journal_path import path_length_problem
from .journal_rows import SELECT_TASKS, job_policy, noted, stored_job_digest, task_rows
from .journal_schema import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    Upgraded,
    check_or_init,
    refuse_damaged,
    refuse_empty,
    refuse_foreign,
)
from .journal_wal import bound_wal
from .journal_write import JournalEntry, split_at_bulk, write_records
from .state import JobRecord, JobState, TaskState

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "Compaction", "Journal", "JournalEntry"]

log = get_logger(__name__)

REPLAY_NOTE_S = 5.0  # a long replay says how far it got this often
_FOLDED = "('done', 'cancelled')"  # task states whose rows compaction folds into counts
_PAGE_PRAGMAS = ("page_count", "freelist_count", "page_size")
_COMPACTABLE = (
    "SELECT job_id FROM jobs WHERE state != 'running' AND finished_at <= ? "
    "AND job_id NOT IN (SELECT job_id FROM compacted_jobs) ORDER BY seq"
)


def _make_file(path: Path) -> None:
    """Make the journal's file where missing, mode 0o666 less the umask, as the rest of a run's
    folder is made: SQLite makes it 0644 whatever the umask (a group-shared run folder then held
    a journal only its maker could write), and its ``-wal`` and ``-shm`` take the file's mode."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
    except OSError:  # there already (kept as it is), or not to be made: SQLite says why
        pass


@dataclasses.dataclass(frozen=True, slots=True)
class Compaction:
    """What :meth:`Journal.compact` did.

    Attributes:
        jobs: finished jobs compacted now.
        task_rows: task rows removed (folded into the jobs' counts).
        job_ids: those jobs, in submit order.
    """

    jobs: int
    task_rows: int
    job_ids: tuple[str, ...] = dataclasses.field(default=(), compare=False)


class Journal:
    """A durable journal of one master's jobs and tasks. Use :meth:`open`, not the constructor.

    Args:
        conn: an open, checked connection.
        path: where the journal lives.
        lock: the journal's lock, held by this object and released by :meth:`close`.
        upgraded: its upgrade from an older schema as :meth:`open` opened it, None if none.
        left_open: who had it open and did not close it, where :meth:`open` found it so with
            no ``-wal`` beside it (``journal_opened.py``); None if not.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        lock: JournalLock | None = None,
        upgraded: Upgraded | None = None,
        left_open: LeftOpen | None = None,
    ) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._path = path
        self._lock = lock
        # Where the journal as it was lies: a caller with a user says so (a run's folder keeps it).
        self.upgraded = upgraded
        # Its log may lie where it was before a move: a caller with a user says so.
        self.left_open = left_open
        self._checked = False  # rows checked once: nothing but this object writes while locked
        self._later: list[JournalEntry] = []  # staged records the commit writes (see stage)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        create: bool = False,
        new_hint: str = "pass create=True to start a new journal there",
        lock: JournalLock | None = None,
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
            lock: the journal's lock, held already (``JournalLock.acquire(path)``): taken over
                rather than taken again, for a caller that held the journal from its own checks
                on (``troupe run``'s output folder). It stays the caller's until this returns the
                journal, whose :meth:`close` frees it; a refused open leaves it held.

        Returns:
            The open journal (its :attr:`upgraded` says where an older schema's copy was kept).

        Raises:
            JournalBusy: another process (or another open journal object) holds the journal.
            JournalError: the path is too long for SQLite (``journal_path.py``), the file is
                missing (and ``create`` is False, or a ``-wal`` is there without it:
                ``journal_opened.py``), is not a SQLite
                database, is not a troupe journal, has another schema version, or fails
                ``PRAGMA quick_check``.
        """
        path = Path(path)
        if (too_long := path_length_problem(path)) is not None:  # first: nothing made yet
            raise JournalError(f"journal {path} is {too_long}: give a shorter path")
        refuse_orphaned_wal(path)  # said before "does not exist": --new would delete it
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
        had_wal = wal_bytes(path) > 0  # before the read-only checks, which leave an empty one
        with translated(path, "opening"):
            refuse_foreign(path)  # before the lock: it leaves no lock file beside another's file
        if lock is None:
            held = JournalLock.acquire(path)  # before SQLite touches the file: it may create it
        elif lock.held and lock.path == lock_path(path):
            held = lock
        else:
            raise ValueError(f"journal {path}: the lock handed over is not its own, held ({lock.path})")
        try:
            refuse_empty(path, create, new_hint)
            with translated(path, "opening"):
                refuse_damaged(path)
                if create:
                    _make_file(path)
                conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except BaseException:
            if lock is None:
                held.release()
            raise
        try:
            held.cover(path)  # the file SQLite may just have created: a hard link to it is refused
            with translated(path, "opening"):
                created, upgraded = check_or_init(conn, path, create, new_hint)
                conn.execute("PRAGMA synchronous = FULL")
                bound_wal(conn)  # the room the log takes is known: journal_wal.py
                unclosed = left_open(conn, had_wal)
                mark_open(conn)
        except BaseException:
            conn.close()
            if lock is None:
                held.release()
            raise
        log.info("journal_opened", path=str(path), created=created)
        if unclosed is not None:
            log.warning(
                "journal_left_open",
                path=str(path),
                opened_by_pid=unclosed.pid,
                opened_by_host=unclosed.host,
                opened_at=unclosed.opened_at,
                hint=f"not closed cleanly and no {path.name}-wal beside it: moved or copied without it?",
            )
        return cls(conn, path, held, upgraded, unclosed)

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
        now, later = split_at_bulk(records)
        with translated(self._path, "appending"):
            conn.execute("BEGIN IMMEDIATE")
            try:
                write_records(conn, now)
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
        with translated(self._path, "appending"):
            try:
                write_records(conn, later)
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
            with translated(self._path, "rolling back"):
                conn.execute("ROLLBACK")

    def replay(self, note_s: float = REPLAY_NOTE_S) -> TaskBook:
        """Rebuild the task book from the journal, as it was at the last append.

        Args:
            note_s: seconds between the ``journal_replaying`` lines of a long replay.

        Returns:
            A book with every job and task; leased tasks held over for their holders, no workers.

        Raises:
            JournalError: the journal cannot be read or holds rows that make no sense; a row of
                the wrong type or shape is named (table, row id, column, value).
        """
        conn = self._connection()
        with translated(self._path, "replaying"):
            self._check(conn)
            jobs = [
                JobRecord(job_id, name, seq, JobState(state), job_policy(policy), submitted_at)
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
            kept_ids = conn.execute("SELECT task_id, job_id FROM compacted_task_ids").fetchall()
            started = time.monotonic()
            total = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
            rows = noted(task_rows(conn.execute(SELECT_TASKS)), total, self._path, note_s)
            with collector_paused():  # a few objects a task, all kept (see gc_pauses)
                book = TaskBook.restore(jobs, rows, compacted, lease_floor, digests, kept_ids)
        log.info(
            "journal_replayed",
            path=str(self._path),
            jobs=len(jobs),
            compacted_jobs=len(compacted),
            tasks=total,
            took_s=round(time.monotonic() - started, 3),
        )
        return book

    def compactable(self, finished_before: float) -> list[str]:
        """The jobs :meth:`compact` would compact now, in submit order.

        Args:
            finished_before: as :meth:`compact`'s.

        Raises:
            JournalError: the journal cannot be read.
        """
        conn = self._connection()
        with translated(self._path, "compacting"):
            return [row[0] for row in conn.execute(_COMPACTABLE, (finished_before,))]

    def compact(self, finished_before: float, digests: Mapping[str, str] | None = None) -> Compaction:
        """Fold the task rows of jobs that finished before a time into per-job counts.

        Done and cancelled task rows of each such job are deleted and counted in one
        ``compacted_jobs`` row; dead task rows stay (``ctl dead`` lists them with their
        errors). A replay then reads one row per compacted job instead of one per task. One
        transaction: a failure keeps nothing of it.

        Args:
            finished_before: compact jobs whose ``finished_at`` (epoch seconds) is at or
                before this; ``time.time()`` compacts every finished job.
            digests: compact only these jobs (those of them that still finished before then),
                each with its tasks' ``job_digest``, taken by the caller from the tasks it
                holds (a running master, from its book: ``master/compaction.py``). None: every
                such job, its digest taken from its rows here.

        Returns:
            How many jobs were compacted, which, and how many task rows removed.

        Raises:
            JournalError: the journal holds a bad row (nothing is changed), or the write failed.
        """
        conn = self._connection()
        with translated(self._path, "compacting"):
            self._check(conn)
            conn.execute("BEGIN IMMEDIATE")
            try:
                now = time.time()
                job_ids = [j for (j,) in conn.execute(_COMPACTABLE, (finished_before,))]
                if digests is not None:
                    job_ids = [j for j in job_ids if j in digests]
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS compacting (job_id TEXT PRIMARY KEY)")
                conn.execute("DELETE FROM compacting")
                conn.executemany("INSERT INTO compacting VALUES (?)", ((j,) for j in job_ids))
                counts = dict.fromkeys(job_ids, (0, 0, 0))
                for job_id, done, cancelled, last_lease_id in conn.execute(
                    "SELECT job_id, sum(state = 'done'), sum(state = 'cancelled'), "
                    f"max(last_lease_id) FROM tasks WHERE state IN {_FOLDED} "
                    "AND job_id IN (SELECT job_id FROM compacting) GROUP BY job_id"
                ):
                    counts[job_id] = (done, cancelled, last_lease_id)
                # Every task the job had, in submit order: a submit of it again is compared by this.
                if digests is None:
                    digests = {job_id: stored_job_digest(conn, job_id) for job_id in job_ids}
                conn.executemany(  # the lease ids are kept: new leases go on above them
                    "INSERT INTO compacted_jobs (job_id, done, cancelled, last_lease_id, "
                    "compacted_at, content) VALUES (?, ?, ?, ?, ?, ?)",
                    [(job_id, *row, now, digests[job_id]) for job_id, row in counts.items()],
                )
                conn.execute(  # their ids stay taken (compacted_ids.py): no new job reuses one
                    "INSERT INTO compacted_task_ids (task_id, job_id) SELECT task_id, job_id FROM tasks "
                    f"WHERE state IN {_FOLDED} AND job_id IN (SELECT job_id FROM compacting) "
                    f"AND {KEPT_ONE_BY_ONE_SQL}"
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
        if job_ids:
            log.info("journal_compacted", path=str(self._path), jobs=len(job_ids), task_rows=removed)
        return Compaction(len(job_ids), removed, tuple(job_ids))

    def pages(self) -> tuple[int, int, int]:
        """The journal's pages as SQLite counts them: how many, how many of them are free (left
        by deleted rows, reused by later writes), and their size in bytes."""
        conn = self._connection()
        with translated(self._path, "counting pages"):
            count, free, size = (int(conn.execute(f"PRAGMA {name}").fetchone()[0]) for name in _PAGE_PRAGMAS)
        return count, free, size

    def vacuum(self) -> None:
        """Rewrite the journal without its free pages and cut its log to nothing, so its file
        shrinks to what it holds: ``VACUUM`` then a truncating checkpoint. It needs room for a
        copy of what the journal holds (``master/journal_shrink.py`` checks it first); one that
        fails changes nothing.

        Raises:
            JournalError: the rewrite failed (a full disk, a transaction open).
        """
        conn = self._connection()
        with translated(self._path, "shrinking"):
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self, release: bool = True) -> None:
        """Close the journal and free its lock; further use raises JournalError. Closing twice
        is fine. The close takes the journal's open mark off (``journal_opened.py``) and SQLite's
        checkpoints its ``-wal`` into it and deletes it: the journal is one file again.

        Args:
            release: False keeps the lock held, for the caller that handed it to :meth:`open`
                and goes on holding the journal (one found damaged only as it was read back).
        """
        try:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                try:
                    mark_closed(conn)
                except sqlite3.Error as exc:  # the close goes on; the next open may warn for nothing
                    log.warning("journal_open_mark_kept", path=str(self._path), error=str(exc))
                with translated(self._path, "closing"):
                    conn.close()
        finally:
            if self._lock is not None and release:
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
        check_rows(conn, self._path, ["jobs", "tasks", "compacted_jobs", "compacted_task_ids"])
        for rowid, policy in conn.execute("SELECT rowid, policy FROM jobs ORDER BY rowid"):
            try:
                job_policy(policy)
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                raise bad_row(conn, self._path, "jobs", rowid, "policy", f"a job policy ({exc})") from None
        self._checked = True
