"""The task book's tables and placement: where tasks wait and which one a worker gets.

:class:`Task`, :class:`LeaseSlot`, :class:`Job` and :class:`Worker` are mutable rows; nothing
outside the book sees them. :class:`TaskTables` holds them, keeps the counts by state, answers
the read-outs (frozen values of :mod:`troupe.runtime.taskstate`) and rebuilds itself from the
journal; :class:`~troupe.runtime.taskbook.TaskBook` adds the transitions on top.

A job's pending tasks sit in buckets keyed by ``(locality, needs)``, each a heap ordered by the
task's submit sequence, so a worker that cannot run GPU tasks, or that sits on another node,
never scans past tasks it will not take. :func:`pick_task` serves a worker in two passes over
the running jobs (by priority, then submit order): first the tasks whose locality is the
worker's node, then tasks with no locality or whose node cannot take them now (not registered,
draining, or no worker there with a free slot that fits), so a hint never starves a task.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import Self

from .errors import TaskError
from .speculation import RunningMedian
from .taskstate import (
    FINAL_STATES,
    DeadLetter,
    JobPolicy,
    JobRecord,
    JobState,
    JobSummary,
    Resources,
    TaskBookStats,
    TaskInfo,
    TaskRecord,
    TaskSpec,
    TaskState,
    WorkerLoad,
)

__all__ = [
    "EPSILON",
    "BucketKey",
    "Job",
    "LeaseSlot",
    "PendingQueue",
    "Task",
    "TaskTables",
    "Worker",
    "fits",
    "pick_task",
]

EPSILON = 1e-9  # CPU amounts are floats; sums of fractions must not refuse an exact fit

BucketKey = tuple[str | None, Resources]


def fits(needs: Resources, free_cpu: float, free_gpu: int) -> bool:
    """Return whether a task needing ``needs`` fits in the free CPU and GPUs of a worker.

    Args:
        needs: what one copy of the task holds.
        free_cpu: CPU the worker has not leased out.
        free_gpu: GPUs the worker has not leased out.

    Returns:
        True if both fit.
    """
    return needs.gpu <= free_gpu and needs.cpu <= free_cpu + EPSILON


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
        key = (task.spec.locality, task.spec.needs)
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


class Task:
    """One task's live row. ``copies`` are its running leases, by lease id."""

    __slots__ = (
        "attempts", "copies", "error", "job", "last_lease_id", "not_before", "result_ref",
        "seq", "spec", "state", "traceback",
    )

    def __init__(self, spec: TaskSpec, job: Job, seq: int) -> None:
        self.spec = spec
        self.job = job
        self.seq = seq
        self.state = TaskState.PENDING
        self.attempts = 0
        self.not_before = 0.0
        self.last_lease_id = 0
        self.result_ref: str | None = None
        self.error: str | None = None
        self.traceback: str | None = None
        self.copies: dict[int, LeaseSlot] = {}


class LeaseSlot:
    """One running copy of a task on a worker."""

    __slots__ = ("backup", "deadline", "lease_id", "start", "task", "worker")

    def __init__(
        self, lease_id: int, task: Task, worker: Worker, start: float, deadline: float,
        backup: bool,
    ) -> None:
        self.lease_id = lease_id
        self.task = task
        self.worker = worker
        self.start = start
        self.deadline = deadline
        self.backup = backup


class Job:
    """One job's live row: its tasks, counts by state, pending queue and done durations."""

    __slots__ = (
        "counts", "durations", "job_id", "leased", "name", "policy", "queue", "seq", "state",
        "submitted_at", "tasks",
    )

    def __init__(
        self, job_id: str, name: str, seq: int, policy: JobPolicy, submitted_at: float
    ) -> None:
        self.job_id = job_id
        self.name = name
        self.seq = seq
        self.policy = policy
        self.submitted_at = submitted_at
        self.queue = PendingQueue()
        self.durations = RunningMedian()  # of done tasks, for speculation
        self.state = JobState.RUNNING
        self.tasks: list[Task] = []
        self.counts = dict.fromkeys(TaskState, 0)
        self.leased: dict[str, Task] = {}  # tasks in LEASED, in the order they were leased


class Worker:
    """One registered worker and what it holds."""

    __slots__ = ("leases", "node_id", "resources", "slots", "used_cpu", "used_gpu", "worker_id")

    def __init__(self, worker_id: str, node_id: str, resources: Resources, slots: int) -> None:
        self.worker_id = worker_id
        self.node_id = node_id
        self.resources = resources
        self.slots = slots
        self.leases: dict[int, LeaseSlot] = {}
        self.used_cpu = 0.0
        self.used_gpu = 0

    @property
    def free_cpu(self) -> float:
        """CPU not leased out."""
        return self.resources.cpu - self.used_cpu

    @property
    def free_gpu(self) -> int:
        """GPUs not leased out."""
        return self.resources.gpu - self.used_gpu

    def can_take(self, needs: Resources) -> bool:
        """Return whether a task with these needs fits now (a free slot and the resources)."""
        return len(self.leases) < self.slots and fits(needs, self.free_cpu, self.free_gpu)

    def hold(self, lease: LeaseSlot) -> None:
        """Account for a new lease."""
        self.leases[lease.lease_id] = lease
        self.used_cpu += lease.task.spec.needs.cpu
        self.used_gpu += lease.task.spec.needs.gpu

    def release(self, lease: LeaseSlot) -> None:
        """Give back what a lease held (no-op if it is not held here)."""
        if self.leases.pop(lease.lease_id, None) is None:
            return
        if self.leases:
            self.used_cpu -= lease.task.spec.needs.cpu
            self.used_gpu -= lease.task.spec.needs.gpu
        else:  # reset, so float sums never drift
            self.used_cpu, self.used_gpu = 0.0, 0


def pick_task(
    worker: Worker, jobs: list[Job], node_can_take: Callable[[str, Resources], bool]
) -> Task | None:
    """Remove and return the pending task the worker should run next, or None.

    Args:
        worker: the asking worker; the task must fit what it has free.
        jobs: running jobs in service order (priority, then submit order).
        node_can_take: whether a node could run a task with these needs now.

    Returns:
        The task, already out of its job's queue; the caller leases it.
    """
    node, free_cpu, free_gpu = worker.node_id, worker.free_cpu, worker.free_gpu

    def local(key: BucketKey) -> bool:
        return key[0] == node and fits(key[1], free_cpu, free_gpu)

    cannot_take: dict[BucketKey, bool] = {}

    def elsewhere(key: BucketKey) -> bool:
        locality, needs = key
        if locality == node or not fits(needs, free_cpu, free_gpu):
            return False
        if locality is None:
            return True
        if key not in cannot_take:
            cannot_take[key] = not node_can_take(locality, needs)
        return cannot_take[key]

    for accept in (local, elsewhere):
        for job in jobs:
            key = job.queue.best(accept)
            if key is not None:
                return job.queue.pop(key)
    return None


class TaskTables:
    """Every row of the book, the counts by state, and the read-outs of them."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._running: list[Job] = []  # running jobs in service order: priority, submit order
        self._tasks: dict[str, Task] = {}
        self._workers: dict[str, Worker] = {}
        self._nodes: dict[str, set[str]] = {}  # node id -> its worker ids
        self._draining: set[str] = set()
        self._leases: dict[int, LeaseSlot] = {}
        self._totals = dict.fromkeys(TaskState, 0)
        self._next_lease = 1
        self._next_job_seq = 0
        self._next_task_seq = 0
        self._spec_launched = 0
        self._spec_won = 0

    @classmethod
    def restore(
        cls, jobs: Iterable[JobRecord], tasks: Iterable[tuple[TaskSpec, TaskRecord]]
    ) -> Self:
        """Rebuild the book from journaled rows after a restart.

        Done, dead and cancelled tasks stay so. Leased and backing-off tasks become pending:
        their leases are void (a late Complete from one is still accepted, see
        :mod:`troupe.runtime.taskbook`) and the attempt is not counted, since the restart was
        not the task's fault. Lease ids go on above every id ever issued.

        Args:
            jobs: every job row.
            tasks: every task's spec and row, in submit order.

        Returns:
            The book, with no workers: they register again.

        Raises:
            TaskError: a task row names a job that has no row.
        """
        book = cls()
        for rec in sorted(jobs, key=lambda r: r.seq):
            job = book._add_job(rec.job_id, rec.name, rec.seq, rec.policy, rec.submitted_at)
            if rec.state is not JobState.RUNNING:
                job.state = rec.state
                book._running.remove(job)
        last_lease = 0
        for spec, rec in tasks:
            job = book._jobs.get(rec.job_id)
            if job is None:
                raise TaskError(f"task {rec.task_id} names job {rec.job_id}, which has no row")
            task = book._add_task(spec, job)
            task.attempts, task.last_lease_id = rec.attempts, rec.last_lease_id
            task.result_ref, task.error, task.traceback = rec.result_ref, rec.error, rec.traceback
            state = rec.state
            if state in (TaskState.LEASED, TaskState.FAILED):
                state = TaskState.PENDING
            if job.state is JobState.CANCELLED and state not in FINAL_STATES:
                state = TaskState.CANCELLED
            book._set_state(task, state)
            if state is TaskState.PENDING:
                job.queue.push(task)
            last_lease = max(last_lease, rec.last_lease_id)
        book._next_lease = last_lease + 1
        return book

    def statistics(self) -> TaskBookStats:
        """Return a frozen snapshot: counts by state, per job, worker loads, leases, backups."""
        return TaskBookStats(
            tasks=MappingProxyType(dict(self._totals)),
            jobs=MappingProxyType(
                {job.job_id: MappingProxyType(dict(job.counts)) for job in self._jobs.values()}
            ),
            workers=MappingProxyType({wid: self.worker_load(wid) for wid in self._workers}),
            leases_outstanding=len(self._leases),
            speculative_launched=self._spec_launched,
            speculative_won=self._spec_won,
        )

    def worker_load(self, worker_id: str) -> WorkerLoad:
        """Return the live load of one worker.

        Raises:
            TaskError: no such worker is registered.
        """
        w = self._workers.get(worker_id)
        if w is None:
            raise TaskError(f"unknown worker {worker_id!r}")
        draining = w.node_id in self._draining
        return WorkerLoad(w.worker_id, w.node_id, w.slots, len(w.leases), draining)

    def jobs(self) -> list[JobSummary]:
        """Return every job (running or ended) in submit order."""
        return [
            JobSummary(
                j.job_id, j.name, j.state, j.policy.priority, j.submitted_at, len(j.tasks),
                MappingProxyType(dict(j.counts)),
            )
            for j in self._jobs.values()
        ]

    def dead_letters(self, job_id: str) -> list[DeadLetter]:
        """Return the dead-lettered tasks of a job, in submit order, with their last error.

        Raises:
            TaskError: no such job.
        """
        job = self._jobs.get(job_id)
        if job is None:
            raise TaskError(f"unknown job {job_id!r}")
        return [
            DeadLetter(t.spec.task_id, job_id, t.attempts, t.error or "", t.traceback or "")
            for t in job.tasks
            if t.state is TaskState.DEAD
        ]

    def task(self, task_id: str) -> TaskInfo:
        """Return one task as the book sees it now.

        Raises:
            TaskError: no such task.
        """
        t = self._tasks.get(task_id)
        if t is None:
            raise TaskError(f"unknown task {task_id!r}")
        return TaskInfo(
            task_id, t.job.job_id, t.state, t.attempts, len(t.copies), t.not_before,
            t.result_ref, t.error,
        )

    def _add_job(
        self, job_id: str, name: str, seq: int | None, policy: JobPolicy, submitted_at: float
    ) -> Job:
        if seq is None:
            seq = self._next_job_seq
        self._next_job_seq = max(self._next_job_seq, seq + 1)
        job = Job(job_id, name, seq, policy, submitted_at)
        self._jobs[job_id] = job
        bisect.insort(self._running, job, key=lambda j: (-j.policy.priority, j.seq))
        return job

    def _add_task(self, spec: TaskSpec, job: Job) -> Task:
        """Register a task as PENDING (the caller queues it, or moves it on)."""
        task = Task(spec, job, self._next_task_seq)
        self._next_task_seq += 1
        self._tasks[spec.task_id] = task
        job.tasks.append(task)
        job.counts[TaskState.PENDING] += 1
        self._totals[TaskState.PENDING] += 1
        return task

    def _set_state(self, task: Task, state: TaskState) -> None:
        old = task.state
        if old is state:
            return
        job = task.job
        job.counts[old] -= 1
        job.counts[state] += 1
        self._totals[old] -= 1
        self._totals[state] += 1
        if old is TaskState.LEASED:
            del job.leased[task.spec.task_id]
        elif state is TaskState.LEASED:
            job.leased[task.spec.task_id] = task
        task.state = state

    def _node_can_take(self, node: str, needs: Resources) -> bool:
        """Whether a worker of the node could run a task with these needs right now."""
        if node in self._draining:
            return False
        return any(self._workers[w].can_take(needs) for w in self._nodes.get(node, ()))
