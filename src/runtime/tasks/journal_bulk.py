"""A big job's task rows, inserted thousands per statement with the GIL free.

``executemany`` binds each row's values in Python and takes the GIL back after every row's
insert; in the master's commit thread that hands the GIL to and from the busy event loop once a
row (a convoy: each hand-back may wait a switch interval), and on the loop itself a million
rows held it for seconds. Here a chunk of rows becomes one JSON text (built with the GIL, a few
milliseconds a chunk) that one ``INSERT ... SELECT FROM json_each(?)`` inserts: SQLite runs the
whole chunk in one step, with the GIL released. ``json_each`` walks the text in order, so the
rows keep the tasks' order (``seq``), as ``executemany`` did.

Tasks that follow each other with the same kind, refs, needs and locality (every task of a
``count`` job) are a run: its chunks are objects ``{task_id: seed}``, whose keys and values
``json_each`` yields as they are, the other columns bound once. Other tasks go as arrays of
rows, one ``json_extract`` per column (each parses the row's array again: four times the cost).

Measured on two cores, 200,000 rows: runs 1.2 us a row in SQLite and 0.9 to build, arrays 3.8
and 1.7. From a thread while the main thread computes for a share of every millisecond
(50,000 rows): idle, ``executemany`` 5.8 us a row and arrays 7.7; half busy, 12.3 against 9.5;
busy, 83.7 against 9.1. A master whose loop is busy while a big job is written needs chunks.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence, Sized
from itertools import groupby

from .state import TaskSpec

__all__ = ["BULK_TASKS", "CHUNK_TASKS", "insert_tasks", "is_bulk", "refs_text"]

BULK_TASKS = 4096  # a job with at least this many tasks is inserted here (see journal.stage)
CHUNK_TASKS = 8192  # tasks per statement: one chunk's JSON holds the GIL ~15 ms to build

_COLUMNS = (
    "INSERT INTO tasks (task_id, job_id, kind, seed, refs, cpu, gpu, locality, state, attempts, "
    "not_before, last_lease_id) "
)
_INSERT_RUN = _COLUMNS + "SELECT key, ?, ?, value, ?, ?, ?, ?, 'pending', 0, 0.0, 0 FROM json_each(?)"
_INSERT_ROWS = _COLUMNS + (
    "SELECT json_extract(value, '$[0]'), ?, json_extract(value, '$[1]'), json_extract(value, '$[2]'), "
    "json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'), "
    "json_extract(value, '$[6]'), 'pending', 0, 0.0, 0 FROM json_each(?)"
)
_MIN_RUN = 64  # shorter runs go as rows: a statement each would cost more than it saves


def is_bulk(tasks: Sized) -> bool:
    """Whether a job of these tasks is big: its rows are written here, by the commit's thread
    (``journal.stage``), and the master's dispatcher ends its batch with it."""
    return len(tasks) >= BULK_TASKS


def insert_tasks(conn: sqlite3.Connection, job_id: str, specs: Sequence[TaskSpec]) -> None:
    """Insert a job's tasks as pending rows, in order, inside the caller's transaction.

    Raises:
        ValueError: a value JSON cannot carry exactly (a non-finite number), or a task id used
            twice in a run (the book refuses such a job before it is journaled).
        sqlite3.Error: the insert failed (the caller's transaction is left to roll back).
    """
    rows: list[tuple[object, ...]] = []
    for _, group in groupby(specs, key=_alike):
        run = list(group)
        if len(run) < _MIN_RUN:
            rows += map(_row, run)
            if len(rows) >= CHUNK_TASKS:
                _insert_rows(conn, job_id, rows)
                rows = []
            continue
        if rows:  # what came before the run goes first: the rows keep the tasks' order
            _insert_rows(conn, job_id, rows)
            rows = []
        first = run[0]
        shared = (first.kind, refs_text(first), float(first.needs.cpu), first.needs.gpu, first.locality)
        for start in range(0, len(run), CHUNK_TASKS):
            chunk = run[start : start + CHUNK_TASKS]
            seeds = {s.task_id: s.seed for s in chunk}
            if len(seeds) != len(chunk):
                raise ValueError(f"job {job_id!r} names a task id twice")
            conn.execute(_INSERT_RUN, (job_id, *shared, json.dumps(seeds)))
    if rows:
        _insert_rows(conn, job_id, rows)


def _alike(s: TaskSpec) -> tuple[object, ...]:
    # refs by identity: a count job's tasks share one mapping; equal copies only end a run
    return (s.kind, id(s.refs), s.needs, s.locality)


def _insert_rows(conn: sqlite3.Connection, job_id: str, rows: list[tuple[object, ...]]) -> None:
    for start in range(0, len(rows), CHUNK_TASKS):
        chunk = json.dumps(rows[start : start + CHUNK_TASKS], allow_nan=False)
        conn.execute(_INSERT_ROWS, (job_id, chunk))


def refs_text(s: TaskSpec) -> str:
    """A task's refs as the journal stores them: sorted JSON, ``{}`` for none."""
    return json.dumps(dict(s.refs), sort_keys=True) if s.refs else "{}"


def _row(s: TaskSpec) -> tuple[object, ...]:
    return (s.task_id, s.kind, s.seed, refs_text(s), float(s.needs.cpu), s.needs.gpu, s.locality)
