"""Placement: which pending task a worker gets, and what a task no worker could take waits for.

A job's pending tasks sit in buckets keyed by ``(locality, needs, kind)``
(:mod:`troupe.runtime.tasks.pending_queue`), so a worker that cannot run GPU tasks, that runs
other task kinds, or that sits on another node, never scans past tasks it will not take (a kind
mismatch never reaches a worker, so it never costs an attempt). :func:`pick_task` serves a worker
in two passes over the running jobs (by priority, then submit order): first the tasks whose
locality is the worker's node, then tasks with no locality or whose node cannot take them now
(not registered, draining, or no worker there with a free slot that fits), so a hint never
starves a task. :func:`waiting_reason` says which pending tasks no registered worker could ever
take: a kind nobody runs, or resources nobody has.

The rows both read are in :mod:`troupe.runtime.tasks.book_rows`; the tables that hold them, and
ask these, in :mod:`troupe.runtime.tasks.task_tables`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet

from .book_rows import EPSILON, Job, Task, Worker, fits
from .pending_queue import BucketKey
from .state import Resources

__all__ = ["pick_task", "waiting_reason"]


def pick_task(
    worker: Worker,
    jobs: list[Job],
    node_can_take: Callable[[str, Resources, str], bool],
    ahead: bool = False,
) -> Task | None:
    """Remove and return the pending task the worker should run next, or None.

    Args:
        worker: the asking worker; the task must be of a kind it runs and fit what it has free.
        jobs: running jobs in service order (priority, then submit order).
        node_can_take: whether a node could run a task with these needs and kind now.
        ahead: a lease ahead (prefetch): the task must fit the worker's whole resources, since
            it starts only once a running copy has ended.

    Returns:
        The task, already out of its job's queue; the caller leases it.
    """
    node = worker.node_id
    if ahead:
        free_cpu, free_gpu = worker.resources.cpu, worker.resources.gpu
    else:
        free_cpu, free_gpu = worker.free_cpu, worker.free_gpu

    def local(key: BucketKey) -> bool:
        return key[0] == node and fits(key[1], free_cpu, free_gpu) and worker.runs(key[2])

    cannot_take: dict[BucketKey, bool] = {}

    def elsewhere(key: BucketKey) -> bool:
        locality, needs, kind = key
        if locality == node or not fits(needs, free_cpu, free_gpu) or not worker.runs(kind):
            return False
        if locality is None:
            return True
        if key not in cannot_take:
            cannot_take[key] = not node_can_take(locality, needs, kind)
        return cannot_take[key]

    for accept in (local, elsewhere):
        for job in jobs:
            key = job.queue.best(accept)
            if key is not None:
                return job.queue.pop(key)
    return None


def waiting_reason(
    kind: str, needs: Resources, workers: Iterable[Worker], draining: AbstractSet[str] = frozenset()
) -> str | None:
    """Say why no registered worker could ever take a task of ``kind`` needing ``needs``.

    Args:
        kind: the task kind.
        needs: what one copy holds.
        workers: the registered workers (the live ones: a dead node's workers have left).
        draining: the draining nodes, whose workers take no new task.

    Returns:
        ``waiting for kind K: no live worker runs it``, ``waiting for kind K: every worker
        that runs it is draining (node N; ...)``, ``waiting for gpu=1: no worker has it``
        (``...no worker that runs kind K has it`` when only workers of other kinds have it), or
        None when some worker could.
    """
    pool = list(workers)
    everyone = [w for w in pool if w.node_id not in draining]
    able = [w for w in everyone if w.runs(kind)]
    if not able:
        held = sorted({w.node_id for w in pool if w.node_id in draining and w.runs(kind)})
        if held:
            nodes = f"node{'s' if len(held) > 1 else ''} {', '.join(held)}"
            return (
                f"waiting for kind {kind}: every worker that runs it is draining ({nodes}; "
                "`troupe ctl undrain NODE` resumes one)"
            )
        return f"waiting for kind {kind}: no live worker runs it"
    if any(fits(needs, w.resources.cpu, w.resources.gpu) for w in able):
        return None
    short = []
    if not any(needs.gpu <= w.resources.gpu for w in able):
        short.append(f"gpu={needs.gpu}")
    if not any(needs.cpu <= w.resources.cpu + EPSILON for w in able):
        short.append(f"cpu={needs.cpu:g}")
    what = ", ".join(short) or f"cpu={needs.cpu:g} and gpu={needs.gpu} together"
    if any(fits(needs, w.resources.cpu, w.resources.gpu) for w in everyone):
        return f"waiting for {what}: no worker that runs kind {kind} has it"
    return f"waiting for {what}: no worker has it"
