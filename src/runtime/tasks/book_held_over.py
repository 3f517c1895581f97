"""The leases a master restart held over: their start, their claim by a worker, their end.

A restarted master keeps each leased task's last lease (``TaskTables.restore``), held by no
worker until a Renew or report names its lease id, whose sender then holds it, registered
again or not yet (the rule is told in :mod:`troupe.runtime.tasks.book`).
:class:`HeldOverLeases` starts them at the book's first event, hands one to the worker that
names it, puts back one nobody named within its lease, and all of them at once for a master
whose earlier holders are known gone.
"""

from __future__ import annotations

import heapq

from troupe.runtime.library_logging import get_logger

from .book_moves import BookMoves
from .book_rows import LeaseSlot, Worker
from .state import (
    Command,
    Resources,
    TaskState,
)

__all__ = ["HeldOverLeases"]

log = get_logger(__name__)

LEASED = TaskState.LEASED


class HeldOverLeases(BookMoves):
    """The held-over leases' start, claim and end (see the module docstring)."""

    def release_held_over(self) -> int:
        """Put back at once, with no attempt counted, every lease a restart held over that no
        worker has named yet: for a master whose earlier holders are all known gone (a one-host
        run's own master: the run that held them was its process), where waiting a lease for
        them would only hold their tasks. Nothing is journaled: the rows still say leased, and
        a restart on them holds them over again.

        Returns:
            How many tasks went back to pending.
        """
        released = 0
        for lease in [lease for lease in self._leases.values() if lease.worker is self._unclaimed]:
            self._drop_lease(lease)
            if not lease.task.copies and lease.task.state is LEASED:
                self._enqueue(lease.task)
                released += 1
        return released

    def _claim(self, lease: LeaseSlot, worker_id: str, node_id: str = "", pid: int = 0) -> None:
        """A lease held over a restart is named by a worker (a Renew or a report): the lease id
        went to that worker alone, so it is the holder, registered again or not yet. One not
        registered yet holds it under its id, its node and its process (``node_id`` and
        ``pid``, which a Renew says): its death (``WorkerLeft``, ``NodeDead``), or another
        process registering under its id, requeues it at once, as a registered holder's."""
        holder = self._workers.get(worker_id)
        if holder is None:
            holder = self._unregistered.get(worker_id)
            if holder is None:
                holder = self._unregistered[worker_id] = Worker(worker_id, node_id, Resources(0.0, 0), 1)
            holder.node_id = holder.node_id or node_id
            holder.pid = holder.pid or pid
        self._move_lease(lease, holder)
        log.info(
            "held_over_lease_claimed",
            task_id=lease.task.spec.task_id,
            lease_id=lease.lease_id,
            worker=worker_id,
            registered=worker_id in self._workers,
        )

    def _start_held_over(self, now: float) -> None:
        """Start the leases a restart held over (see ``TaskTables.restore``) at the first event:
        each lasts its job's ``lease_s`` from now, and runs from now for speculation."""
        for lease in self._restored_leases:
            if lease.lease_id in self._leases:
                lease.start = lease.task.leased_at = now
                lease.deadline = now + lease.task.job.policy.lease_s
                heapq.heappush(self._expiry, (lease.deadline, lease.lease_id))
        self._restored_leases = []

    def _held_over_expired(self, lease: LeaseSlot, out: list[Command]) -> None:
        """No worker named a lease held over a restart within its lease: its holder died while
        the master was down, or cannot reach it. The task goes back with no attempt counted
        (the restart was not the task's fault) and no one to tell."""
        task = lease.task
        log.info(
            "held_over_lease_expired",
            task_id=task.spec.task_id,
            lease_id=lease.lease_id,
            job_id=task.job.job_id,
            lease_s=task.job.policy.lease_s,
        )
        if not task.copies and task.state is LEASED:
            self._enqueue(task)
            out.append(self._record(task))
