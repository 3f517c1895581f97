"""What a :class:`~troupe.runtime.tasks.getter.TaskGetter` is told and what it counts.

:class:`GetterConfig` (who the worker is, how it asks for tasks, how many leases it holds ahead)
and :class:`GetterStats` (a snapshot of its counters) are plain values: the bench, the tests and
the worker process build and read them without the getter's machinery, so they sit apart from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from troupe.runtime.errors import TaskError

__all__ = ["MAX_PREFETCH", "GetterConfig", "GetterStats"]

MAX_PREFETCH = 64
"""The most leases a worker may hold ahead of its slots (``WorkerJoined.prefetch``). Here, not
in :mod:`~troupe.runtime.tasks.state` (which re-exports it), so that a worker process, which
checks its own prefetch, does not import the state module's three dozen event dataclasses
(about 16 ms of its template's start) for one number."""


@dataclass(frozen=True, slots=True)
class GetterConfig:
    """How one worker asks for tasks.

    Attributes:
        worker_id: unique in the cluster; ``node/process`` for real workers.
        node_id: the node the worker runs on (locality, drain, node death).
        slots: tasks run at once.
        cpu: CPU cores offered to tasks (default: one per slot).
        gpu: GPUs offered to tasks.
        kinds: task kinds the worker runs; the master leases it only these (empty: every kind).
        wait_s: how long the master may hold a request while nothing is pending.
        call_timeout_s: added to ``wait_s`` before a call to the master counts as lost.
        retry_s: pause after a failed call before trying again.
        report_for_s: how long a complete or fail report is retried before it is dropped;
            None (the default): until a master answers it. A master restarted on its journal
            holds the lease over and takes the report however long it was down, where a report
            dropped left the lease to run out there and the task to run again.
        prefetch: leases held ahead of the slots, each waiting in the worker for a slot (0:
            none, one lease per slot). They hide the round trip to the master between two
            tasks; see :mod:`troupe.runtime.tasks.getter` for why the default is 1.
        prefetch_wait_s: a lease ahead that waited this long for a slot is given back, and a
            worker whose last task ran this long asks for no lease ahead.
    """

    worker_id: str
    node_id: str
    slots: int = 1
    cpu: float | None = None
    gpu: int = 0
    kinds: tuple[str, ...] = ()
    wait_s: float = 2.0
    call_timeout_s: float = 5.0
    retry_s: float = 0.5
    report_for_s: float | None = None
    prefetch: int = 1
    prefetch_wait_s: float = 2.0

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise TaskError(f"worker {self.worker_id}: slots must be >= 1, got {self.slots}")
        if not 0 <= self.prefetch <= MAX_PREFETCH:
            raise TaskError(
                f"worker {self.worker_id}: prefetch must be 0..{MAX_PREFETCH}, got {self.prefetch}"
            )
        if not self.prefetch_wait_s > 0:
            raise TaskError(
                f"worker {self.worker_id}: prefetch_wait_s must be > 0, got {self.prefetch_wait_s}"
            )


@dataclass(frozen=True, slots=True)
class GetterStats:
    """Counters of one getter.

    Attributes:
        running: copies running now.
        started: copies started.
        completed: copies reported complete.
        failed: copies reported failed.
        declined: copies returned unrun, of a kind this worker does not run.
        cancelled: copies stopped by the master or by a refused renewal.
        registrations: times the worker registered (more than one: the master restarted).
        requests: request_task calls made (reports with a piggybacked request not counted).
        lost_reports: reports dropped: refused, or unanswered for ``report_for_s``.
        waiting: leases held ahead now, waiting for a slot.
        given_back: leases ahead given back after waiting ``prefetch_wait_s``.
        withdrawn: leases ahead the master ended before they started (cancelled, renewal
            refused); never run, so not among ``cancelled``.
        renewals: renew messages sent (each renews every lease held).
        rejected: ``complete`` reports the master answered ``rejected`` (a result it refused:
            the attempt failed there), not counted completed.
    """

    running: int
    started: int
    completed: int
    failed: int
    declined: int
    cancelled: int
    registrations: int
    requests: int
    lost_reports: int
    waiting: int = 0
    given_back: int = 0
    withdrawn: int = 0
    renewals: int = 0
    rejected: int = 0
