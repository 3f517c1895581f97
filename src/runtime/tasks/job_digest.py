"""A job's content in one string: what a submit of it again is compared by once the journal
compacted its tasks away (their rows folded into counts, ``Journal.compact``).

A submit is idempotent: the same id and content answers "already submitted". The book compares
a job's tasks one by one while it has them; a compacted job keeps this digest instead, taken at
compaction from every task the job had, in submit order (from its rows, or, in a running
master, from its book's specs: the same tasks, those the rows were written from), so the same
file submitted again a day later (a batch script rerun) is still "already submitted", not "job
id taken".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from .state import TaskSpec

__all__ = ["JobDigest", "job_digest"]

# json.dumps(row, separators=...), without making an encoder for each row (a third of the time)
_ROW = json.JSONEncoder(separators=(",", ":")).encode


class JobDigest:
    """A job's digest taken a slice of its tasks at a time (a running master's compaction
    digests a million tasks between its batches, not in one go); :func:`job_digest` in one."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def add(self, tasks: Iterable[TaskSpec]) -> None:
        """Take in the next tasks, in submit order."""
        sha = self._sha
        for t in tasks:
            row = [t.task_id, t.kind, t.seed, sorted(t.refs.items()), t.needs.cpu, t.needs.gpu, t.locality]
            sha.update(_ROW(row).encode())
            sha.update(b"\n")

    def hexdigest(self) -> str:
        """The digest of every task taken in so far."""
        return self._sha.hexdigest()


def job_digest(tasks: Iterable[TaskSpec]) -> str:
    """The sha256 of the tasks' specs, in order (ids, kinds, seeds, refs, needs, locality)."""
    digest = JobDigest()
    digest.add(tasks)
    return digest.hexdigest()
