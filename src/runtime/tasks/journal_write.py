"""The rows a batch of records writes: jobs upserted, tasks inserted, updated or cancelled.

:func:`write_records` turns the task book's records, in their order, into statements on an
open transaction (:meth:`~troupe.runtime.tasks.journal.Journal.stage` and ``commit`` open and
end it); a big job's task rows go through ``journal_bulk.py``, and :func:`split_at_bulk` says
which records wait for the commit's thread. Apart from ``journal.py``: the SQL of writing, which
the opening, replay and compaction never use.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator

from troupe.runtime.errors import JournalError

from .journal_bulk import insert_tasks, is_bulk, refs_text
from .state import (
    FINAL_STATES,
    JobRecord,
    JobState,
    JobSubmitted,
    JobTasksCancelled,
    Record,
    TaskRecord,
    TaskSpec,
    TaskState,
)

__all__ = ["JournalEntry", "spec_rows", "split_at_bulk", "write_records"]

JournalEntry = Record | JobSubmitted | JobRecord | TaskRecord | JobTasksCancelled  # what append() takes
_UPSERT_JOB = (  # a job keeps the time it first finished
    "INSERT INTO jobs (job_id, name, seq, state, policy, submitted_at, finished_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job_id) DO UPDATE SET name = excluded.name, seq = excluded.seq, "
    "state = excluded.state, policy = excluded.policy, submitted_at = excluded.submitted_at, "
    "finished_at = CASE WHEN excluded.finished_at IS NULL THEN NULL "
    "ELSE coalesce(jobs.finished_at, excluded.finished_at) END"
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


def write_records(conn: sqlite3.Connection, records: Iterable[JournalEntry]) -> None:
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
                conn.executemany(_INSERT_TASK, spec_rows(entry.job.job_id, entry.tasks))
        elif isinstance(entry, JobRecord):
            conn.execute(_UPSERT_JOB, _job_row(entry))
        elif isinstance(entry, JobTasksCancelled):
            _cancel_tasks(conn, entry)
        else:
            raise TypeError(f"not a journal record: {entry!r}")
    _update_tasks(conn, updates)


def _update_tasks(conn: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    if not rows:
        return
    cursor = conn.executemany(_UPDATE_TASK, rows)
    if cursor.rowcount != len(rows):
        raise JournalError(
            f"{len(rows) - cursor.rowcount} task record(s) name tasks the "
            "journal does not hold; the journal belongs to another master"
        )


def split_at_bulk(records: list[JournalEntry]) -> tuple[list[JournalEntry], list[JournalEntry]]:
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


def spec_rows(job_id: str, specs: Iterable[TaskSpec]) -> Iterator[tuple[object, ...]]:
    for s in specs:
        yield (s.task_id, job_id, s.kind, s.seed, refs_text(s), s.needs.cpu, s.needs.gpu, s.locality)
