"""The task ids of compacted jobs, still taken: a new job may not reuse one.

Compaction (``Journal.compact``, ``TaskTables.fold``) drops a finished job's done and cancelled
tasks from the book and the journal. Their ids stayed in use where it matters: the output store
is keyed by task id alone, so a new job that reused one was "done" at once with the old job's
output, its own work never run (report jx 5). So a compacted job's ids stay known, in two forms:

- an id shaped as one of the job's own generated ids (``<job id>-<6 or more digits>``,
  ``jobspec.generated_task_id``) is not kept one by one: the job's id stays taken (its row
  stays), so no other job generates it, and an explicit id of that shape is refused while the
  job is known to have been compacted (:func:`generated_owner`);
- any other id (an explicit ``[[tasks]] id``) is kept with its job, in the book and in the
  journal's ``compacted_task_ids`` table, written in the transaction that drops the task rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["KEPT_ONE_BY_ONE_SQL", "CompactedIds", "generated_owner"]

_LEAST_DIGITS = 6  # generated_task_id pads the index to six digits

# SQL for "task_id is not shaped as one of job_id's own generated ids": the rows Journal.compact
# keeps one by one. Must agree with generated_owner (tests/runtime/tasks/test_compacted_ids.py).
KEPT_ONE_BY_ONE_SQL = (
    "NOT (substr(task_id, 1, length(job_id) + 1) = job_id || '-' "
    f"AND length(task_id) >= length(job_id) + {_LEAST_DIGITS + 1} "
    "AND substr(task_id, length(job_id) + 2) NOT GLOB '*[^0-9]*')"
)


def generated_owner(task_id: str) -> str | None:
    """The job id that ``task_id`` is shaped as a generated id of (``<job id>-<digits>``, six or
    more ASCII digits), or None."""
    head, dash, tail = task_id.rpartition("-")
    if dash and len(tail) >= _LEAST_DIGITS and tail.isascii() and tail.isdigit():
        return head
    return None


class CompactedIds:
    """The ids of compacted jobs' folded tasks (see the module docstring)."""

    __slots__ = ("_ids", "_jobs")

    def __init__(self) -> None:
        self._ids: dict[str, str] = {}  # an explicit id -> its compacted job's id
        self._jobs: set[str] = set()  # compacted jobs that folded tasks: their generated ids

    def add_job(self, job_id: str) -> None:
        """``job_id`` folded tasks: ids shaped as its generated ones are taken by it."""
        self._jobs.add(job_id)

    def add(self, job_id: str, task_id: str) -> None:
        """Keep a folded task's id, unless its job's own id already accounts for it."""
        if generated_owner(task_id) != job_id:
            self._ids[task_id] = job_id

    def whose(self, task_id: str) -> str | None:
        """The compacted job that had ``task_id``, or None."""
        job_id = self._ids.get(task_id)
        if job_id is None:
            owner = generated_owner(task_id)
            job_id = owner if owner in self._jobs else None
        return job_id

    def any_of(self, task_ids: Sequence[str]) -> bool:
        """Whether any of ``task_ids`` may be taken (checked as a whole: a million ids at once)."""
        if not self._ids.keys().isdisjoint(task_ids):
            return True
        return bool(self._jobs) and not self._jobs.isdisjoint(_heads(task_ids))

    def __len__(self) -> int:
        return len(self._ids)


def _heads(task_ids: Iterable[str]) -> set[str]:
    """What precedes each id's last '-': a superset of their generated owners."""
    return {task_id.rpartition("-")[0] for task_id in task_ids}
