"""The task book's tables and placement: where tasks wait and which one a worker gets.

:class:`Task`, :class:`LeaseSlot`, :class:`Job` and :class:`Worker` are mutable rows; nothing
outside the book sees them. :class:`TaskTables` holds them, keeps the counts by state, answers
the read-outs (frozen values of :mod:`troupe.runtime.tasks.state`) and rebuilds itself from the
journal; :class:`~troupe.runtime.tasks.book.TaskBook` adds the transitions on top.

A job's pending tasks sit in buckets keyed by ``(locality, needs, kind)``, each a heap ordered
by the task's submit sequence, so a worker that cannot run GPU tasks, that runs other task
kinds, or that sits on another node, never scans past tasks it will not take (a kind mismatch
never reaches a worker, so it never costs an attempt). :func:`pick_task` serves a worker in
two passes over the running jobs (by priority, then submit order): first the tasks whose locality is the
worker's node, then tasks with no locality or whose node cannot take them now (not registered,
draining, or no worker there with a free slot that fits), so a hint never starves a task.

Each job also counts its pending tasks by ``(kind, needs)``, so :meth:`TaskTables.jobs` can say,
at the cost of a pass over the workers per distinct pair, which pending tasks no registered
worker could ever take: a kind nobody runs, or resources nobody has.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import groupby, repeat
from types import MappingProxyType
from typing import Self

from troupe.runtime.errors import TaskError
from troupe.runtime.gc_pauses import collector_paused

from .job_digest import job_digest
from .speculation import RunningMedian
from .state import (
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
    Waiting,
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
    "waiting_reason",
]

EPSILON = 1e-9  # CPU amounts are floats; sums of fractions must not refuse an exact fit

BucketKey = tuple[str | None, Resources, str]  # (locality, needs, kind)


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


class Task:
    """One task's live row. ``copies`` are its running leases, by lease id."""

    __slots__ = (
        "attempts",
        "copies",
        "error",
        "job",
        "last_lease_id",
        "leased_at",
        "not_before",
        "result_ref",
        "seq",
        "spec",
        "state",
        "traceback",
    )

    def __init__(self, spec: TaskSpec, job: Job, seq: int) -> None:
        self.spec = spec
        self.job = job
        self.seq = seq
        self.state = TaskState.PENDING
        self.attempts = 0
        self.not_before = 0.0
        self.last_lease_id = 0
        self.leased_at = 0.0  # when it last became LEASED (its first running copy's start)
        self.result_ref: str | None = None
        self.error: str | None = None
        self.traceback: str | None = None
        self.copies: dict[int, LeaseSlot] = {}


class LeaseSlot:
    """One running copy of a task on a worker."""

    __slots__ = ("backup", "deadline", "lease_id", "start", "task", "worker")

    def __init__(
        self,
        lease_id: int,
        task: Task,
        worker: Worker,
        start: float,
        deadline: float,
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
        "compacted",
        "counts",
        "digest",
        "durations",
        "job_id",
        "leased",
        "name",
        "pending_by",
        "policy",
        "queue",
        "seq",
        "state",
        "submitted_at",
        "tasks",
    )

    def __init__(self, job_id: str, name: str, seq: int, policy: JobPolicy, submitted_at: float) -> None:
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
        self.pending_by: dict[tuple[str, Resources], int] = {}  # PENDING tasks by (kind, needs)
        self.compacted = 0  # tasks the journal folded into counts (no Task rows; see compact)
        self.digest: str | None = None  # once compacted: its tasks' job_digest, to compare a submit


class Worker:
    """One registered worker and what it holds.

    ``kinds`` are the task kinds it said it runs (empty: every kind); ``declined`` the kinds it
    returned a task of anyway (see :class:`~troupe.runtime.tasks.state.Decline`), never leased to
    it again. ``prefetch`` leases beyond its ``slots`` may wait in the worker for a slot: such a
    lease must fit the worker's whole resources (it runs once a running copy has ended), so
    ``used_cpu`` may exceed ``resources.cpu`` while the worker holds leases ahead.
    """

    __slots__ = (
        "declined",
        "kinds",
        "leases",
        "node_id",
        "prefetch",
        "resources",
        "slots",
        "used_cpu",
        "used_gpu",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: str,
        node_id: str,
        resources: Resources,
        slots: int,
        kinds: frozenset[str] = frozenset(),
        prefetch: int = 0,
    ) -> None:
        self.worker_id = worker_id
        self.node_id = node_id
        self.resources = resources
        self.slots = slots
        self.kinds = kinds
        self.prefetch = prefetch
        self.declined: set[str] = set()
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

    def runs(self, kind: str) -> bool:
        """Return whether the worker runs tasks of ``kind``."""
        return (not self.kinds or kind in self.kinds) and kind not in self.declined

    def can_take(self, needs: Resources, kind: str) -> bool:
        """Return whether a task of this kind and needs fits now (a free slot, the resources)."""
        return len(self.leases) < self.slots and fits(needs, self.free_cpu, self.free_gpu) and self.runs(kind)

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


def _untouched(rec: TaskRecord) -> bool:
    """A task row as its submit wrote it: pending, never leased, nothing recorded."""
    return (
        rec.state is TaskState.PENDING
        and not rec.attempts
        and not rec.last_lease_id
        and rec.result_ref is None
        and rec.error is None
        and rec.traceback is None
    )


def waiting_reason(kind: str, needs: Resources, workers: Iterable[Worker]) -> str | None:
    """Say why no registered worker could ever take a task of ``kind`` needing ``needs``.

    Args:
        kind: the task kind.
        needs: what one copy holds.
        workers: the registered workers (the live ones: a dead node's workers have left).

    Returns:
        ``waiting for kind K: no live worker runs it``, ``waiting for gpu=1: no worker has
        it`` (``...no worker that runs kind K has it`` when only workers of other kinds have
        it), or None when some worker could.
    """
    everyone = list(workers)
    able = [w for w in everyone if w.runs(kind)]
    if not able:
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
        cls,
        jobs: Iterable[JobRecord],
        tasks: Iterable[tuple[TaskSpec, TaskRecord]],
        compacted: Mapping[str, Mapping[TaskState, int]] | None = None,
        lease_floor: int = 0,
        digests: Mapping[str, str] | None = None,
    ) -> Self:
        """Rebuild the book from journaled rows after a restart.

        Done, dead and cancelled tasks stay so. Leased and backing-off tasks become pending:
        their leases are void (a late Complete from one is still accepted, see
        :mod:`troupe.runtime.tasks.book`) and the attempt is not counted, since the restart was
        not the task's fault. Lease ids go on above every id ever issued.

        Args:
            jobs: every job row.
            tasks: every task's spec and row, in submit order.
            compacted: per job, counts by state of its tasks that the journal compacted away
                (they are counted, but have no rows: ``task()`` does not know them).
            lease_floor: the highest lease id those compacted tasks had been issued.
            digests: per compacted job, its tasks' ``job_digest`` (a submit of it again is
                compared by it).

        Returns:
            The book, with no workers: they register again.

        Raises:
            TaskError: a task row (or a compacted count) names a job that has no row.
        """
        book = cls()
        job: Job | None  # each loop below looks its jobs up
        for row in sorted(jobs, key=lambda r: r.seq):
            job = book._add_job(row.job_id, row.name, row.seq, row.policy, row.submitted_at)
            if row.state is not JobState.RUNNING:
                job.state = row.state
                book._running.remove(job)
        last_lease = 0
        run: list[TaskSpec] = []  # tasks never leased, of one job, back to back: added as a whole
        run_job: Job | None = None

        def add_run() -> None:
            nonlocal run
            if run_job is not None and run:
                book._add_new_tasks(run, run_job)
                run = []

        for spec, rec in tasks:
            job = book._jobs.get(rec.job_id)
            if job is None:
                raise TaskError(f"task {rec.task_id} names job {rec.job_id}, which has no row")
            if job is not run_job:
                add_run()
                run_job = job
            if _untouched(rec) and job.state is not JobState.CANCELLED:
                run.append(spec)
                continue
            add_run()
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
        add_run()
        book._next_lease = max(last_lease, lease_floor) + 1
        for job_id, counts in (compacted or {}).items():
            job = book._jobs.get(job_id)
            if job is None:
                raise TaskError(f"compacted counts name job {job_id}, which has no row")
            for state, n in counts.items():
                job.counts[state] += n
                book._totals[state] += n
                job.compacted += n
        for job_id, digest in (digests or {}).items():
            if job_id in book._jobs:
                book._jobs[job_id].digest = digest
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

    def leases_of(self, worker_id: str) -> dict[int, str]:
        """The leases a worker holds, lease id -> task id (none for a worker not registered)."""
        w = self._workers.get(worker_id)
        return {} if w is None else {lease_id: slot.task.spec.task_id for lease_id, slot in w.leases.items()}

    def jobs(self) -> list[JobSummary]:
        """Return every job (running or ended) in submit order, and what stuck tasks wait for."""
        reasons: dict[tuple[str, Resources], str | None] = {}
        summaries = []
        for j in self._jobs.values():
            waiting = []
            for (kind, needs), n in j.pending_by.items():
                if n <= 0:
                    continue
                if (kind, needs) not in reasons:
                    reasons[kind, needs] = waiting_reason(kind, needs, self._workers.values())
                reason = reasons[kind, needs]
                if reason is not None:
                    waiting.append(Waiting(kind, needs, n, reason))
            summaries.append(
                JobSummary(
                    j.job_id,
                    j.name,
                    j.state,
                    j.policy.priority,
                    j.submitted_at,
                    len(j.tasks) + j.compacted,
                    MappingProxyType(dict(j.counts)),
                    tuple(waiting),
                    MappingProxyType(dict(j.tasks[0].spec.refs)) if j.tasks else MappingProxyType({}),
                )
            )
        return summaries

    def same_job(self, job_id: str, tasks: Iterable[TaskSpec], policy: JobPolicy, name: str) -> bool:
        """Return whether job ``job_id`` exists with exactly these tasks, policy and name.

        A submit repeated after a lost reply is recognized by this, and answered as already
        there instead of "job id taken".
        """
        job = self._jobs.get(job_id)
        if job is None or job.policy != policy or job.name != (name or job_id):
            return False
        specs = list(tasks)
        if job.compacted:  # its tasks' rows are folded: compared by what compaction kept
            return (
                job.digest is not None
                and len(specs) == len(job.tasks) + job.compacted
                and job_digest(specs) == job.digest
            )
        return len(specs) == len(job.tasks) and all(
            t.spec == spec for t, spec in zip(job.tasks, specs, strict=True)
        )

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

    def draining_nodes(self) -> frozenset[str]:
        """The nodes drained (``troupe ctl drain``) and not undrained since."""
        return frozenset(self._draining)

    def done_results(self, job_id: str, task_ids: Iterable[str]) -> dict[str, str]:
        """Return the result ref of each of ``task_ids`` that is a done task of the job; the
        others (not done, not the job's, compacted away) are left out.

        Raises:
            TaskError: no such job.
        """
        job = self._jobs.get(job_id)
        if job is None:
            raise TaskError(f"unknown job {job_id!r}")
        done: dict[str, str] = {}
        for task_id in task_ids:
            t = self._tasks.get(task_id)
            if t is not None and t.job is job and t.state is TaskState.DONE:
                done[task_id] = t.result_ref or ""
        return done

    def result_counts(self, job_id: str) -> dict[str, int]:
        """How a job's tasks ended: ``dead`` and ``cancelled``, and the done ones by their result
        ref (a pipeline's ``ok`` and ``pruned``); those the journal compacted away are counted
        as ``compacted`` (their refs are gone). Tasks not ended are left out.

        Raises:
            TaskError: no such job.
        """
        job = self._jobs.get(job_id)
        if job is None:
            raise TaskError(f"unknown job {job_id!r}")
        counts: dict[str, int] = {"compacted": job.compacted} if job.compacted else {}
        for t in job.tasks:
            if t.state is TaskState.DONE:
                end = t.result_ref or ""
            elif t.state in (TaskState.DEAD, TaskState.CANCELLED):
                end = str(t.state)
            else:
                continue
            counts[end] = counts.get(end, 0) + 1
        return counts

    def task(self, task_id: str) -> TaskInfo:
        """Return one task as the book sees it now.

        Raises:
            TaskError: no such task.
        """
        t = self._tasks.get(task_id)
        if t is None:
            raise TaskError(f"unknown task {task_id!r}")
        return TaskInfo(
            task_id,
            t.job.job_id,
            t.state,
            t.attempts,
            len(t.copies),
            t.not_before,
            t.result_ref,
            t.error,
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
        self._count_pending(task, 1)
        return task

    def _add_new_tasks(self, specs: Sequence[TaskSpec], job: Job) -> None:
        """Register a new job's tasks as PENDING and queue them: :meth:`_add_task` and
        ``push`` for each, at a fraction of the cost (a million tasks in one submit). The
        collector is paused meanwhile (``gc_pauses.collector_paused``): a few objects a task,
        none of them garbage, and the collections they set off were half of the time."""
        with collector_paused():
            first = self._next_task_seq
            tasks = list(map(Task, specs, repeat(job), range(first, first + len(specs))))
            self._next_task_seq = first + len(tasks)
            self._tasks.update(zip([s.task_id for s in specs], tasks, strict=True))
            job.tasks.extend(tasks)
            job.counts[TaskState.PENDING] += len(tasks)
            self._totals[TaskState.PENDING] += len(tasks)
            by = job.pending_by
            for key, run in groupby(specs, key=lambda s: (s.kind, s.needs)):
                by[key] = by.get(key, 0) + sum(1 for _ in run)
            job.queue.push_new(tasks)

    @staticmethod
    def _count_pending(task: Task, delta: int) -> None:
        key = (task.spec.kind, task.spec.needs)
        by = task.job.pending_by
        n = by.get(key, 0) + delta
        if n:
            by[key] = n
        else:
            del by[key]

    def _cancel_all(self, job: Job, live: list[Task]) -> None:
        """``_set_state(task, CANCELLED)`` for each of ``live``: every task of ``job`` not final
        yet, none of them holding a lease any more."""
        counts, totals = job.counts, self._totals
        for task in live:
            counts[task.state] -= 1
            totals[task.state] -= 1
            task.state = TaskState.CANCELLED
        counts[TaskState.CANCELLED] += len(live)
        totals[TaskState.CANCELLED] += len(live)
        job.leased.clear()
        job.pending_by.clear()

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
        if old is TaskState.PENDING:
            self._count_pending(task, -1)
        elif state is TaskState.PENDING:
            self._count_pending(task, 1)
        task.state = state

    def _node_can_take(self, node: str, needs: Resources, kind: str) -> bool:
        """Whether a worker of the node could run a task of this kind and needs right now."""
        if node in self._draining:
            return False
        return any(self._workers[w].can_take(needs, kind) for w in self._nodes.get(node, ()))
