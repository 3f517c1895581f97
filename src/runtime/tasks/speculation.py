"""Speculative tails: when a running task is slow enough to deserve a backup copy.

A job's tail is the time when none of its tasks waits any more but a few still run; one slow
host then holds up the whole job (the losses Nimbus blames on tail effects). When a worker asks
for work and no task is pending for it, :func:`pick_backup` looks, job by job, for a job in
its tail (nothing pending or backing off) whose slowest running task has run longer than
``max(min_runtime_s, factor x median duration of the job's done tasks)``; that task gets a
backup copy on the asking worker, at most ``max_copies`` backups per task, never two copies on
one worker. The median is kept by :class:`RunningMedian` in O(log n) per done task.

Prefetch (leases held ahead of a worker's slots, see :mod:`troupe.runtime.tasks.book`): a
backup is never leased ahead, since one queued behind a running copy would overtake nothing;
it goes only to a free slot. The median is of the copies' own run times (``Complete.run_s``,
as the worker measured them), not of the time since the lease, which for a lease ahead
includes its wait for a slot. A running time here is still the time since the lease: a lease
ahead waiting behind a slow copy may look like a straggler and get a backup on an idle worker,
which at a job's tail is what should happen (work queued behind a slow worker moves to an idle
one, and whichever copy ends first wins as always).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .state import Speculation, TaskState

if TYPE_CHECKING:  # a job's row keeps a RunningMedian, so import the rows lazily
    from .book_rows import Job, Task, Worker

__all__ = ["RunningMedian", "pick_backup", "straggler_threshold"]


class RunningMedian:
    """The median of a growing set of numbers, kept in two heaps."""

    def __init__(self) -> None:
        self._low: list[float] = []  # max-heap, negated: the smaller half
        self._high: list[float] = []  # min-heap: the larger half

    def __len__(self) -> int:
        return len(self._low) + len(self._high)

    def add(self, value: float) -> None:
        """Add one number."""
        if self._low and value > -self._low[0]:
            heapq.heappush(self._high, value)
        else:
            heapq.heappush(self._low, -value)
        # keep len(low) == len(high) or len(high) + 1
        if len(self._low) > len(self._high) + 1:
            heapq.heappush(self._high, -heapq.heappop(self._low))
        elif len(self._high) > len(self._low):
            heapq.heappush(self._low, -heapq.heappop(self._high))

    @property
    def median(self) -> float | None:
        """The median, or None before the first number."""
        if not self._low:
            return None
        if len(self._low) > len(self._high):
            return -self._low[0]
        return (-self._low[0] + self._high[0]) / 2.0


def straggler_threshold(policy: Speculation, median: float | None) -> float | None:
    """Return how long a task must have run to get a backup, or None if none may start.

    Args:
        policy: the job's speculation settings.
        median: median duration of the job's done tasks, None if none is done yet.

    Returns:
        ``max(min_runtime_s, factor * median)``, or None when speculation is off or there is
        no median to compare with.
    """
    if not policy.enabled or policy.max_copies < 1 or median is None:
        return None
    return max(policy.min_runtime_s, policy.factor * median)


def pick_backup(worker: Worker, jobs: Iterable[Job], now: float) -> Task | None:
    """Return the running task that should get a backup copy on ``worker``, or None.

    Args:
        worker: the asking worker, for which no pending task fits.
        jobs: running jobs in service order.
        now: the current time.

    Returns:
        The slowest straggler of the first job in its tail that has one.
    """
    for job in jobs:
        counts = job.counts
        if counts[TaskState.PENDING] or counts[TaskState.FAILED] or not job.leased:
            continue  # not in its tail
        policy = job.policy.speculation
        threshold = straggler_threshold(policy, job.durations.median)
        if threshold is None:
            continue
        # job.leased is in the order tasks were leased, and no copy of a task started before
        # it was leased: once a task was leased after the cut-off (or after the slowest found
        # so far) no later one can be slower, so a scan looks at the oldest few, not them all.
        earliest = now - threshold  # strictly "longer than": started before this instant
        slowest: Task | None = None
        for task in job.leased.values():
            if task.leased_at >= earliest:
                break
            copies = task.copies.values()
            if (
                len(copies) <= policy.max_copies
                and worker.can_take(task.spec.needs, task.spec.kind)
                and all(copy.worker is not worker for copy in copies)
            ):
                started = min(copy.start for copy in copies)
                if started < earliest:
                    earliest, slowest = started, task
        if slowest is not None:
            return slowest
    return None
