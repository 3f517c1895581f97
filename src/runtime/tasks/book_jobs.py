"""Jobs in the task book: submitted, cancelled, their dead tasks retried.

:class:`JobSteps` takes a job in (its tasks checked as a whole: ids unique across jobs, those of
compacted jobs included, resources not negative), cancels one (its running copies told to stop;
many tasks in one record), and puts a job's dead tasks back to pending on an operator's word.
The rules are told in :mod:`troupe.runtime.tasks.book`.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from troupe.runtime.library_logging import get_logger

from .book_moves import BookMoves
from .compacted_ids import CompactedIds
from .journal_bulk import BULK_TASKS
from .state import (
    FINAL_STATES,
    CancelJob,
    Command,
    JobState,
    JobSubmitted,
    JobTasksCancelled,
    Record,
    RetryDead,
    SubmitJob,
    TaskSpec,
    TaskState,
)

__all__ = ["JobSteps"]

log = get_logger(__name__)

DEAD, CANCELLED = TaskState.DEAD, TaskState.CANCELLED


class JobSteps(BookMoves):
    """Submitting, cancelling and retrying jobs (see the module docstring)."""

    def _submit(self, ev: SubmitJob, wall: float, out: list[Command]) -> None:
        specs = tuple(ev.tasks)
        if ev.job_id in self._jobs:
            return self._reject(ev, f"job id {ev.job_id!r} is taken; submit under a new id", out)
        if not specs:
            return self._reject(ev, f"job {ev.job_id!r} has no tasks; give it at least one", out)
        problem = _first_problem(specs, self._tasks.keys(), self._compacted_ids)
        if problem:
            return self._reject(ev, problem, out)
        job = self._add_job(ev.job_id, ev.name or ev.job_id, None, ev.policy, wall)
        self._add_new_tasks(specs, job)
        out.append(Record(JobSubmitted(self._job_record(job), specs)))
        log.info("job_submitted", job_id=job.job_id, tasks=len(specs))

    def _cancel(self, ev: CancelJob, out: list[Command]) -> None:
        job = self._jobs.get(ev.job_id)
        if job is None:
            return self._reject(ev, f"unknown job {ev.job_id!r}", out)
        if job.state is not JobState.RUNNING:
            return self._reject(ev, f"job {ev.job_id!r} already ended {job.state}", out)
        live = [task for task in job.tasks if task.state not in FINAL_STATES]
        for task in live:
            if task.copies:
                for lease in list(task.copies.values()):
                    self._drop_lease(lease)
                    if lease.worker is not self._unclaimed:  # no worker to tell
                        out.append(self._cancel_lease(lease, "job cancelled"))
        if len(live) >= BULK_TASKS:
            # One record, and the counts at once: a record per task held the master's loop
            # for seconds (800,000 tasks: 7 s, deaf to every worker and node meanwhile).
            self._cancel_all(job, live)
            first, last = job.tasks[0].spec.task_id, job.tasks[-1].spec.task_id
            out.append(Record(JobTasksCancelled(job.job_id, first, last, len(live))))
        else:
            for task in live:
                self._set_state(task, CANCELLED)
                out.append(self._record(task))
        job.queue.clear()
        self._finish(job, JobState.CANCELLED, out)

    def _retry_dead(self, ev: RetryDead, wall: float, out: list[Command]) -> None:
        job = self._jobs.get(ev.job_id)
        if job is None:
            return self._reject(ev, f"unknown job {ev.job_id!r}; see `troupe ctl jobs`", out)
        if job.state is JobState.CANCELLED:
            said = f"job {ev.job_id!r} was cancelled: its tasks do not run again; submit it under a new id"
            return self._reject(ev, said, out)
        dead = [task for task in job.tasks if task.state is DEAD]
        if not dead:
            return
        if job.state is not JobState.RUNNING:
            self._run_again(job)
            out.append(Record(self._job_record(job)))
        for task in dead:
            task.attempts, task.not_before = 0, wall
            task.error = task.traceback = None
            self._enqueue(task)
            out.append(self._record(task))
        log.info("dead_tasks_retried", job_id=job.job_id, tasks=len(dead))


def _first_problem(specs: Sequence[TaskSpec], known: AbstractSet[str], compacted: CompactedIds) -> str:
    """What is wrong with a job's tasks, for the first task in order that is wrong: an id used
    twice (in the job, by a task ``known`` already, or by a ``compacted`` job's task: the output
    store answers for that id with its output) or a negative resource; empty if none.

    Checked as a whole first (a million tasks in one submit), task by task only on a problem.
    """
    ids = [s.task_id for s in specs]
    needs = {id(s.needs): s.needs for s in specs}.values()
    taken = compacted.any_of(ids)
    if (
        len(set(ids)) == len(ids)
        and known.isdisjoint(ids)
        and not taken
        and all(n.cpu >= 0 and n.gpu >= 0 for n in needs)
    ):
        return ""
    seen: set[str] = set()
    for spec in specs:
        if spec.task_id in seen or spec.task_id in known:
            return f"task id {spec.task_id!r} is used twice; ids must be unique across jobs"
        old_job = compacted.whose(spec.task_id) if taken else None
        if old_job is not None:
            return (
                f"task id {spec.task_id!r} is used twice; ids must be unique across jobs "
                f"(job {old_job!r}, compacted, keeps its tasks' ids)"
            )
        if spec.needs.cpu < 0 or spec.needs.gpu < 0:
            return f"task {spec.task_id!r} needs {spec.needs}; resources must be >= 0"
        seen.add(spec.task_id)
    return ""
