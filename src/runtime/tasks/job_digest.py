"""A job's content in one string: what a submit of it again is compared by once the journal
compacted its tasks away (their rows folded into counts, ``Journal.compact``).

A submit is idempotent: the same id and content answers "already submitted". The book compares
a job's tasks one by one while it has them; a compacted job keeps this digest instead, taken at
compaction from every task row the job had, in submit order, so the same file submitted again a
day later (a batch script rerun) is still "already submitted", not "job id taken".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from .state import TaskSpec

__all__ = ["job_digest"]


def job_digest(tasks: Iterable[TaskSpec]) -> str:
    """The sha256 of the tasks' specs, in order (ids, kinds, seeds, refs, needs, locality)."""
    h = hashlib.sha256()
    for t in tasks:
        row = [t.task_id, t.kind, t.seed, sorted(t.refs.items()), t.needs.cpu, t.needs.gpu, t.locality]
        h.update(json.dumps(row, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()
