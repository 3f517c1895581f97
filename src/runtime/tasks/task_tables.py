"""The task book's tables: every row, the counts by state, the read-outs, the rebuild.

:class:`TaskTables` holds the rows (:mod:`troupe.runtime.tasks.book_rows`), keeps the counts by
state, answers the read-outs (frozen values of :mod:`troupe.runtime.tasks.state`), rebuilds
itself from the journal, and drops a finished job's done and cancelled tasks as the journal's
compaction folds their rows (:meth:`TaskTables.fold`, a running master's compaction);
:class:`~troupe.runtime.tasks.book.TaskBook` adds the transitions on top, and
:mod:`troupe.runtime.tasks.scheduling` places the pending tasks.

Each job also counts its pending tasks by ``(kind, needs)``, so :meth:`TaskTables.jobs` can say,
at the cost of a pass over the workers per distinct pair, which pending tasks no registered
worker could ever take: a kind nobody runs, or resources nobody has.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from itertools import groupby, repeat
from types import MappingProxyType
from typing import Self

from troupe.runtime.errors import TaskError
from troupe.runtime.gc_pauses import collector_paused

from .book_rows import Job, LeaseSlot, Task, Worker
from .compacted_ids import CompactedIds
from .job_digest import job_digest
from .scheduling import waiting_reason
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

__all__ = ["TaskTables"]

_FOLDED = (TaskState.DONE, TaskState.CANCELLED)  # what compaction folds into counts


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
        self._folded: list[Task] = []  # dropped by fold, still known by id: forget_folded
        self._compacted_ids = CompactedIds()  # folded and forgotten, still taken for new jobs
        # Backing off when the journal was replayed: put on the monotonic clock at the first
        # event (``TaskBook.handle``), for the book reads no clock of its own.
        self._restored_backoffs: list[Task] = []
        # Leases held over a restart (see restore): their lease_s starts at the first event too.
        self._restored_leases: list[LeaseSlot] = []
        # The holder of a lease held over a restart that no worker has renewed or reported
        # yet: never registered, so never given a task; the first worker to name the lease id
        # takes the lease (``TaskBook._claim``).
        self._unclaimed = Worker("", "", Resources(0.0, 0), 1)
        # Workers that took a held-over lease before they registered again (a busy worker
        # renews before it asks for work): the row they get as they register takes the leases.
        self._unregistered: dict[str, Worker] = {}
        self._forgotten = 0  # ids forgotten since _tasks was last copied to its size

    @classmethod
    def restore(
        cls,
        jobs: Iterable[JobRecord],
        tasks: Iterable[tuple[TaskSpec, TaskRecord]],
        compacted: Mapping[str, Mapping[TaskState, int]] | None = None,
        lease_floor: int = 0,
        digests: Mapping[str, str] | None = None,
        compacted_ids: Iterable[tuple[str, str]] = (),
    ) -> Self:
        """Rebuild the book from journaled rows after a restart.

        Done, dead and cancelled tasks stay so. A leased task stays leased under its last
        lease (the journaled ``last_lease_id``), held over the restart: its holder runs on, and
        its first Renew or report naming that lease id takes the lease (the journal does not
        say which worker holds it); the lease lasts the job's ``lease_s`` from the book's first
        event, and one that no worker named by then goes back to pending, without an attempt
        counted, since the restart was not the task's fault. An older copy of the task (a
        speculative one, or one whose lease had ended) is not held over: its Renew is refused,
        and its Complete still commits (see :mod:`troupe.runtime.tasks.book`). A backing-off
        task keeps what remains of its backoff (its journaled ``not_before`` is on the wall
        clock; the book's first event re-bases it, see the book's module docstring). Lease ids
        go on above every id ever issued.

        Args:
            jobs: every job row.
            tasks: every task's spec and row, in submit order.
            compacted: per job, counts by state of its tasks that the journal compacted away
                (they are counted, but have no rows: ``task()`` does not know them).
            lease_floor: the highest lease id those compacted tasks had been issued.
            digests: per compacted job, its tasks' ``job_digest`` (a submit of it again is
                compared by it).
            compacted_ids: ``(task id, job id)`` of the compacted tasks whose ids are kept one
                by one (``compacted_ids.py``): no new job may use them.

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
            if state is TaskState.LEASED and rec.last_lease_id < 1:
                state = TaskState.PENDING  # no lease to hold over (not written by a book)
            if job.state is JobState.CANCELLED and state not in FINAL_STATES:
                state = TaskState.CANCELLED
            book._set_state(task, state)
            if state is TaskState.LEASED:
                book._hold_over(task)
            elif state is TaskState.PENDING:
                job.queue.push(task)
            elif state is TaskState.FAILED:
                task.not_before = rec.not_before
                book._restored_backoffs.append(task)
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
            if job.compacted:
                book._compacted_ids.add_job(job.job_id)
        for task_id, job_id in compacted_ids:
            job = book._jobs.get(job_id)
            if job is None:
                raise TaskError(f"compacted task {task_id} names job {job_id}, which has no row")
            book._compacted_ids.add(job.job_id, task_id)  # the job's own str: one per job, not per id
        for job_id, digest in (digests or {}).items():
            if job_id in book._jobs:
                book._jobs[job_id].digest = digest
        return book

    def _hold_over(self, task: Task) -> None:
        """Keep a restored task's last lease, held by no worker until one names it; its start
        and deadline are set at the first event (``TaskBook._start_held_over``)."""
        lease = LeaseSlot(task.last_lease_id, task, self._unclaimed, 0.0, 0.0, False)
        task.copies[lease.lease_id] = lease
        self._unclaimed.hold(lease)
        self._leases[lease.lease_id] = lease
        self._restored_leases.append(lease)

    def fold(self, job_id: str, digest: str) -> int:
        """Drop a finished job's done and cancelled tasks, counted instead: the book a restart
        reads back once the journal compacted the job (``Journal.compact``, ``restore``).

        The counts stay; ``compacted`` counts the tasks dropped and ``digest`` is what a submit
        of the job again is compared by. Dead tasks stay, with their errors (``ctl dead``, a
        retry). The dropped tasks are still found by id until :meth:`forget_folded` has
        forgotten them (a late Complete for one is acked as a duplicate, as before; then it is
        refused as unknown).

        Args:
            job_id: a job that is not running.
            digest: its tasks' ``job_digest``, every task in submit order.

        Returns:
            How many tasks were dropped.

        Raises:
            TaskError: no such job, it is running, or it was compacted already.
        """
        job = self._jobs.get(job_id)
        if job is None or job.state is JobState.RUNNING or job.compacted or job.digest is not None:
            raise TaskError(f"job {job_id!r} is not a finished job holding its tasks; nothing to fold")
        folded = [t for t in job.tasks if t.state in _FOLDED]
        job.tasks = [t for t in job.tasks if t.state not in _FOLDED]
        job.compacted += len(folded)
        job.digest = digest
        job.queue.clear()  # what a lazy removal left there
        job.durations = RunningMedian()  # a restart starts it afresh too
        if folded:
            self._compacted_ids.add_job(job_id)
        self._folded += folded
        return len(folded)

    def forget_folded(self, most: int) -> int:
        """Forget up to ``most`` of the tasks :meth:`fold` dropped (a million at once held the
        master's loop half a second): their rows freed, their ids unknown from now on but
        still taken (``compacted_ids.py``: no new job may use them).

        Returns:
            How many are still to forget.
        """
        folded, tasks = self._folded, self._tasks
        kept = self._compacted_ids
        for task in folded[-most:]:
            kept.add(task.job.job_id, task.spec.task_id)
            del tasks[task.spec.task_id]  # no new task took its id: it was known until now
        self._forgotten += len(folded[-most:])
        del folded[-most:]
        if not folded and self._forgotten > len(tasks):
            # A dict never shrinks as keys go: copied, its table fits the tasks left.
            self._tasks, self._forgotten = dict(tasks), 0
        return len(folded)

    def job_specs(self, job_id: str, start: int = 0, stop: int | None = None) -> list[TaskSpec]:
        """The specs of the tasks a job holds (not those compacted away), in submit order, from
        ``start`` to ``stop`` (Python slice bounds).

        Raises:
            TaskError: no such job.
        """
        job = self._jobs.get(job_id)
        if job is None:
            raise TaskError(f"unknown job {job_id!r}")
        return [t.spec for t in job.tasks[start:stop]]

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
        """The leases a worker holds, lease id -> task id: a registered worker's, or those a
        worker not registered again yet named since a restart held them over; none otherwise."""
        w = self._workers.get(worker_id) or self._unregistered.get(worker_id)
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
                    reasons[kind, needs] = waiting_reason(kind, needs, self._workers.values(), self._draining)
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
        self._run_again(job)
        return job

    def _run_again(self, job: Job) -> None:
        """An ended job runs again (its dead tasks retried): back among the running, in its place."""
        job.state = JobState.RUNNING
        bisect.insort(self._running, job, key=lambda j: (-j.policy.priority, j.seq))

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
