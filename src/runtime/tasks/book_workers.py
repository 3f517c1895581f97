"""The workers and nodes the task book knows: a worker joins, leaves, its node dies or drains.

:class:`WorkerMembership` adds a worker's row as it registers (taking the held-over leases it
named before, and its earlier row's where the same process registers again), and puts back at
once what a worker that left held, or every worker of a node that died or left (a worker that
named held-over leases and has not registered again too); a draining node is reported drained
once its workers hold no lease. The rules are told in :mod:`troupe.runtime.tasks.book`.
"""

from __future__ import annotations

from troupe.runtime.library_logging import get_logger

from .book_moves import BookMoves
from .book_rows import Worker
from .state import (
    Command,
    NodeDead,
    NodeDrained,
    TaskState,
    WorkerJoined,
    WorkerLeft,
)

__all__ = ["WorkerMembership"]

log = get_logger(__name__)

LEASED = TaskState.LEASED


class WorkerMembership(BookMoves):
    """Workers joining and leaving, nodes dying and draining (see the module docstring)."""

    def _worker_joined(self, ev: WorkerJoined, now: float, out: list[Command]) -> None:
        if ev.slots < 1 or ev.resources.cpu < 0 or ev.resources.gpu < 0:
            return self._reject(ev, "a worker needs slots >= 1 and resources >= 0", out)
        again = self._workers.get(ev.worker_id)
        if again is not None and not (again.pid and again.pid == ev.pid):
            self._worker_left(WorkerLeft(ev.worker_id, "rejoined"), now, out)
            again = None
        elif again is not None:
            # The same process registering again: its first registration was answered after
            # it gave up waiting (behind a slow batch) and sent it again. Its tasks run on, so
            # the new row takes its leases (a rejoin puts them back, an attempt lost each).
            self._unlist(again)
        held = self._unregistered.pop(ev.worker_id, None)
        if held is not None and held.pid and ev.pid and held.pid != ev.pid:
            # Leases held over a restart, named by another process of this name that died
            # before it registered (its node's worker_left may come after this, and is then
            # stale): they go back now, as its worker_left would, not a lease later.
            self._leases_lost(
                held, f"a new process (pid {ev.pid}) registered as it", len(held.leases), now, out
            )
            held = None
        worker = Worker(
            ev.worker_id, ev.node_id, ev.resources, ev.slots, frozenset(ev.kinds), max(ev.prefetch, 0), ev.pid
        )
        self._workers[ev.worker_id] = worker
        self._nodes.setdefault(ev.node_id, set()).add(ev.worker_id)
        if again is not None:
            worker.declined = again.declined
        for before in (again, held):  # held: it took leases held over a restart before it registered
            for lease in list(before.leases.values()) if before is not None else ():
                self._move_lease(lease, worker)

    def _worker_left(self, ev: WorkerLeft, now: float, out: list[Command]) -> None:
        worker = self._workers.pop(ev.worker_id, None)
        if worker is None:
            claimant = self._unregistered.get(ev.worker_id)
            if claimant is None:
                return self._reject(ev, f"unknown worker {ev.worker_id!r}", out)
            if ev.pid and claimant.pid and ev.pid != claimant.pid:
                # an older process of its name (it died while the master was down, its node's
                # word came late): the one that named these leases runs them
                said = f"worker_left of pid {ev.pid}; pid {claimant.pid} named its leases"
                return self._reject(ev, said, out)
            del self._unregistered[ev.worker_id]
            # Its slots are unknown (it never registered): each lease it named may have run, so
            # each costs an attempt, as its expiry would have.
            return self._leases_lost(claimant, ev.reason, len(claimant.leases), now, out)
        self._leases_lost(worker, ev.reason, worker.slots, now, out)
        self._unlist(worker)

    def _unlist(self, worker: Worker) -> None:
        node = self._nodes[worker.node_id]
        node.discard(worker.worker_id)
        if not node:
            del self._nodes[worker.node_id]

    def _leases_lost(self, worker: Worker, reason: str, started: int, now: float, out: list[Command]) -> None:
        """A worker is gone: its tasks go back at once. Its oldest ``started`` leases ran (a
        worker starts its leases in the order granted), each an attempt lost; beyond them are
        leases ahead that never started, and their loss is not the task's attempt."""
        leases = sorted(worker.leases.values(), key=lambda lease: lease.lease_id)
        node = worker.node_id or "unknown"
        error = f"worker {worker.worker_id} on node {node} left: {reason or 'no reason'}"
        for n, lease in enumerate(leases):
            self._drop_lease(lease)
            if n < started:
                self._copy_lost(lease.task, now, error, "", out)
            elif not lease.task.copies and lease.task.state is LEASED:
                self._enqueue(lease.task)
                out.append(self._record(lease.task))
        log.info("worker_left", worker=worker.worker_id, reason=reason, requeued=len(leases))

    def _node_dead(self, ev: NodeDead, now: float, out: list[Command]) -> None:
        # with the workers that named held-over leases on the node but have not registered yet
        claimants = [w for w, claimant in self._unregistered.items() if claimant.node_id == ev.node_id]
        for worker_id in sorted({*self._nodes.get(ev.node_id, ()), *claimants}):
            self._worker_left(WorkerLeft(worker_id, "node left" if ev.left else "node dead"), now, out)
        if ev.node_id in self._drain_waiting:
            self._drain_waiting.discard(ev.node_id)
            out.append(NodeDrained(ev.node_id))
        if not ev.left:  # a node that comes back starts afresh; one stopped on purpose, drained
            self._draining.discard(ev.node_id)

    def _report_drained(self, out: list[Command]) -> None:
        for node in sorted(self._drain_waiting):
            if not any(self._workers[w].leases for w in self._nodes.get(node, ())):
                self._drain_waiting.discard(node)
                out.append(NodeDrained(node))
                log.info("node_drained", node=node)
