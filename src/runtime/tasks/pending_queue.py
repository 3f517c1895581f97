"""A job's pending tasks, in buckets a worker can pass over whole.

:class:`PendingQueue` keeps a job's pending tasks in buckets keyed by ``(locality, needs, kind)``
(:data:`BucketKey`), each a heap ordered by the task's submit sequence, so a worker that cannot
run GPU tasks, that runs other task kinds, or that sits on another node, never scans past tasks
it will not take. It is a data structure with rules of its own (lazy removal, every operation
O(log n)), apart from the rows that own one (:mod:`troupe.runtime.tasks.book_rows`) and the
placement that draws from it (:mod:`troupe.runtime.tasks.scheduling`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .state import Resources, TaskState

if TYPE_CHECKING:  # a job's row holds its queue, so import the rows lazily
    from .book_rows import Task

__all__ = ["BucketKey", "PendingQueue"]

BucketKey = tuple[str | None, Resources, str]  # (locality, needs, kind)


class PendingQueue:
    """The pending tasks of one job, FIFO by submit sequence within each bucket.

    Entries are removed lazily: a task that left the pending state some other way (a late
    Complete, a cancel) stays in its heap until it reaches the top, where it is dropped. That
    keeps every operation O(log n).
    """

    def __init__(self) -> None:
        # entries are (seq, task): seqs are unique, so tasks themselves are never compared
        self._buckets: dict[BucketKey, list[tuple[int, Task]]] = {}

    def push(self, task: Task) -> None:
        """Queue a pending task at its submit position."""
        spec = task.spec
        key = (spec.locality, spec.needs, spec.kind)
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [(task.seq, task)]
        else:
            heapq.heappush(bucket, (task.seq, task))

    def best(self, accept: Callable[[BucketKey], bool]) -> BucketKey | None:
        """Return the key of the accepted bucket whose first pending task is oldest.

        Args:
            accept: says whether the caller takes tasks from a bucket.

        Returns:
            The bucket key, or None if no accepted bucket holds a pending task.
        """
        best_seq = -1
        found: BucketKey | None = None
        for key in list(self._buckets):
            if accept(key):
                seq = self._top_seq(key)
                if seq is not None and (found is None or seq < best_seq):
                    best_seq, found = seq, key
        return found

    def push_new(self, tasks: Iterable[Task]) -> None:
        """Queue tasks newer than any queued (a job's submit, in seq order): each one's seq is
        the largest of its bucket, so it goes at the heap's end without sifting."""
        buckets = self._buckets
        last_key: BucketKey | None = None
        bucket: list[tuple[int, Task]] = []
        for task in tasks:
            spec = task.spec
            key = (spec.locality, spec.needs, spec.kind)
            if key != last_key:  # equal keys compare by identity first: no hashing in a run
                bucket = buckets.setdefault(key, [])
                last_key = key
            bucket.append((task.seq, task))

    def pop(self, key: BucketKey) -> Task:
        """Remove and return the first pending task of a bucket that :meth:`best` named."""
        bucket = self._buckets[key]
        _, task = heapq.heappop(bucket)
        if not bucket:
            del self._buckets[key]
        return task

    def clear(self) -> None:
        """Forget every queued task."""
        self._buckets.clear()

    def _top_seq(self, key: BucketKey) -> int | None:
        bucket = self._buckets[key]
        while bucket and bucket[0][1].state is not TaskState.PENDING:
            heapq.heappop(bucket)
        if not bucket:
            del self._buckets[key]
            return None
        return bucket[0][0]
