"""Checks every row of a journal before it is replayed: a row of the wrong shape is refused.

SQLite stores any value in any column (a text seed, a real attempt count), so a journal edited by
hand or written by another program can hold rows that the task book would choke on much later,
in the middle of serving. :func:`check_rows` scans each table once in SQL (``typeof`` and
``json_valid``, so the scan costs little next to the replay itself) and, for the first row at
fault, names the table, the row id, the column, the value and what was expected::

    journal j.db: tasks row 17: seed is 'abc' (text), expected an integer

Nothing is written. The row id is the ``seq`` of a task row and the ``rowid`` of the others.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from troupe.runtime.errors import JournalError

from .state import JobState, TaskState

__all__ = ["bad_row", "check_rows"]

Check = tuple[str, str, str]  # (column, SQL condition that holds for a good value, expected)


def _one_of(column: str, values: list[str]) -> str:
    listed = ", ".join(f"'{v}'" for v in values)
    return f"typeof({column}) = 'text' AND {column} IN ({listed})"


def _json_object(column: str, and_then: str) -> str:
    # CASE, not AND: SQLite may evaluate json_type() before json_valid() and fail on bad JSON
    return (
        f"CASE WHEN typeof({column}) != 'text' THEN 0 WHEN {column} = '{{}}' THEN 1 "
        f"WHEN NOT json_valid({column}) THEN 0 WHEN json_type({column}) != 'object' THEN 0 "
        f"ELSE {and_then} END"
    )


_TEXT = "a text"
_OPTIONAL_TEXT = "a text or null"
_NUMBER = "typeof({0}) IN ('integer', 'real')"
_COUNT = "typeof({0}) = 'integer' AND {0} >= 0"
_TASK_STATES = [s.value for s in TaskState]
_JOB_STATES = [s.value for s in JobState]

_TASK_CHECKS: list[Check] = [
    ("task_id", "typeof(task_id) = 'text' AND task_id != ''", "a non-empty text"),
    ("job_id", "typeof(job_id) = 'text'", _TEXT),
    ("kind", "typeof(kind) = 'text'", _TEXT),
    ("seed", "typeof(seed) = 'integer'", "an integer"),
    (
        "refs",
        _json_object("refs", "NOT EXISTS (SELECT 1 FROM json_each(refs) WHERE json_each.type != 'text')"),
        "a JSON object of texts",
    ),
    ("cpu", _NUMBER.format("cpu") + " AND cpu >= 0", "a number >= 0"),
    ("gpu", _COUNT.format("gpu"), "an integer >= 0"),
    ("locality", "typeof(locality) IN ('text', 'null')", _OPTIONAL_TEXT),
    ("state", _one_of("state", _TASK_STATES), f"one of {', '.join(_TASK_STATES)}"),
    ("attempts", _COUNT.format("attempts"), "an integer >= 0"),
    ("not_before", _NUMBER.format("not_before"), "a number"),
    ("last_lease_id", _COUNT.format("last_lease_id"), "an integer >= 0"),
    ("result_ref", "typeof(result_ref) IN ('text', 'null')", _OPTIONAL_TEXT),
    ("error", "typeof(error) IN ('text', 'null')", _OPTIONAL_TEXT),
    ("traceback", "typeof(traceback) IN ('text', 'null')", _OPTIONAL_TEXT),
]
_JOB_CHECKS: list[Check] = [
    ("job_id", "typeof(job_id) = 'text' AND job_id != ''", "a non-empty text"),
    ("name", "typeof(name) = 'text'", _TEXT),
    ("seq", _COUNT.format("seq"), "an integer >= 0"),
    ("state", _one_of("state", _JOB_STATES), f"one of {', '.join(_JOB_STATES)}"),
    ("policy", _json_object("policy", "1"), "a JSON object"),
    ("submitted_at", _NUMBER.format("submitted_at"), "a number"),
    ("finished_at", "typeof(finished_at) IN ('integer', 'real', 'null')", "a number or null"),
]
_COMPACTED_CHECKS: list[Check] = [
    (
        "job_id",
        "typeof(job_id) = 'text' AND job_id IN (SELECT job_id FROM jobs)",
        "the id of a job in the jobs table",
    ),
    ("done", _COUNT.format("done"), "an integer >= 0"),
    ("cancelled", _COUNT.format("cancelled"), "an integer >= 0"),
    ("last_lease_id", _COUNT.format("last_lease_id"), "an integer >= 0"),
    ("compacted_at", _NUMBER.format("compacted_at"), "a number"),
    ("content", "typeof(content) IN ('text', 'null')", "a digest or null"),
]
_COMPACTED_ID_CHECKS: list[Check] = [
    ("task_id", "typeof(task_id) = 'text' AND task_id != ''", "a non-empty text"),
    (
        "job_id",
        "typeof(job_id) = 'text' AND job_id IN (SELECT job_id FROM compacted_jobs)",
        "the id of a job in the compacted_jobs table",
    ),
]
_TABLES: dict[str, tuple[str, list[Check]]] = {
    "jobs": ("rowid", _JOB_CHECKS),
    "tasks": ("seq", _TASK_CHECKS),
    "compacted_jobs": ("rowid", _COMPACTED_CHECKS),
    "compacted_task_ids": ("rowid", _COMPACTED_ID_CHECKS),
}


def check_rows(conn: sqlite3.Connection, path: Path, tables: list[str]) -> None:
    """Refuse the journal if any row of ``tables`` holds a value of the wrong type or shape.

    Args:
        conn: the open journal.
        path: the journal, named in the error.
        tables: which tables to check (a version-1 journal has no ``compacted_jobs``).

    Raises:
        JournalError: one line naming the table, row id, column, value and expected type.
        sqlite3.Error: the journal could not be read (the caller translates it).
    """
    for table in tables:
        key, checks = _TABLES[table]
        good = " AND ".join(f"coalesce(({condition}), 0)" for _, condition, _ in checks)
        found = conn.execute(
            f"SELECT {key} FROM {table} WHERE NOT ({good}) ORDER BY {key} LIMIT 1"
        ).fetchone()
        if found is not None:
            raise bad_row(conn, path, table, found[0])


def bad_row(
    conn: sqlite3.Connection,
    path: Path,
    table: str,
    row_id: int,
    column: str | None = None,
    expected: str | None = None,
) -> JournalError:
    """Build the refusal for one row: the first failing check, or the ``column`` given.

    Args:
        conn: the open journal.
        path: the journal, named in the error.
        table: the row's table.
        row_id: its ``seq`` (tasks) or ``rowid``.
        column: the column at fault, when the caller already knows it.
        expected: what that column should hold, with ``column``.
    """
    key, checks = _TABLES[table]
    if column is None:
        verdicts = conn.execute(
            f"SELECT {', '.join(f'coalesce(({c}), 0)' for _, c, _ in checks)} FROM {table} WHERE {key} = ?",
            (row_id,),
        ).fetchone()
        column, _, expected = next(check for check, ok in zip(checks, verdicts, strict=True) if not ok)
    value, kind = conn.execute(
        f"SELECT {column}, typeof({column}) FROM {table} WHERE {key} = ?", (row_id,)
    ).fetchone()
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return JournalError(
        f"journal {path}: {table} row {row_id}: {column} is {shown} ({kind}), "
        f"expected {expected}; the row was not written by troupe: fix or delete "
        "it, or restore the journal from a backup (nothing was changed)"
    )
