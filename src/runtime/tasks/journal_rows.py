"""The journal's rows read back: task rows into specs and records, a job's policy, a digest.

:func:`task_rows` decodes the ``tasks`` table's rows (``SELECT_TASKS``) for
:meth:`~troupe.runtime.tasks.journal.Journal.replay`, one shared ``Resources`` per distinct
need; :func:`noted` logs a long replay's progress; :func:`job_policy` reads a ``jobs.policy``
text; :func:`stored_job_digest` is the digest of a job's stored tasks, which compaction keeps.
Apart from ``journal.py``: decoding rows, the hot loop of a master's start.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from troupe.runtime.library_logging import get_logger

from .job_digest import job_digest
from .state import JobPolicy, Resources, Speculation, TaskRecord, TaskSpec, TaskState

__all__ = ["SELECT_TASKS", "job_policy", "noted", "stored_job_digest", "task_rows"]

log = get_logger(__name__)

_TASK_COLUMNS = (
    "task_id, job_id, kind, seed, refs, cpu, gpu, locality, state, attempts, not_before, "
    "last_lease_id, result_ref, error, traceback"
)
SELECT_TASKS = f"SELECT {_TASK_COLUMNS} FROM tasks ORDER BY seq"
_SELECT_JOB_TASKS = f"SELECT {_TASK_COLUMNS} FROM tasks WHERE job_id = ? ORDER BY seq"


def stored_job_digest(conn: sqlite3.Connection, job_id: str) -> str:
    return job_digest(spec for spec, _ in task_rows(conn.execute(_SELECT_JOB_TASKS, (job_id,))))


def job_policy(text: str) -> JobPolicy:
    fields = json.loads(text)
    return JobPolicy(**{**fields, "speculation": Speculation(**fields["speculation"])})


def noted(rows: Iterator[Any], total: int, path: Path, every_s: float) -> Iterator[Any]:
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


def task_rows(rows: Iterable[Any]) -> Iterator[tuple[TaskSpec, TaskRecord]]:
    """Each row's spec and record, sharing what the submit shared: one ``Resources`` per distinct
    need, one string per job id and kind, one refs mapping for a run of rows with the same refs
    (a generated job's tasks all have its one). Each row had its own, about 100 bytes a task
    more than the submit that wrote them: a master that had just accepted a job of 2 million
    tasks was killed by its memory limit as it read them back on a restart (report rs 5)."""
    needs_seen: dict[tuple[float, int], Resources] = {}  # one shared object per distinct need
    names: dict[str, str] = {}  # job ids and kinds: a few distinct ones among millions of rows
    last_refs: tuple[str, dict[str, str]] = ("{}", {})
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
        kind = names.setdefault(kind, kind)
        job_id = names.setdefault(job_id, job_id)
        if refs != last_refs[0]:
            last_refs = (refs, json.loads(refs))
        spec = TaskSpec(task_id, kind, seed, last_refs[1], needs, locality)
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
