"""The master's task bookkeeping: a pure state machine, ``handle(event, now) -> commands``.

No I/O and no clock reads: the time comes in with every event, so tests drive time and the
driver decides what a second is. The vocabulary (events, commands, records) is in
:mod:`troupe.runtime.tasks.state`.

Two clocks, each for its own use. ``now`` is monotonic: every duration (a lease's life, a
backoff's wait, a copy's run time for speculation) is measured on it, so a step of the wall
clock (NTP at boot, an operator's ``date -s``) expires no lease and holds no retry back.
``wall`` is the wall clock, only for what is journaled or shown as a timestamp: a job's
``submitted_at``, a backing-off task's ``not_before``. A journaled ``not_before`` is re-based
after a restart (the monotonic clock of a new process, or a rebooted host, starts elsewhere):
:meth:`TaskBook.handle`'s first call turns each restored backoff into what remains of it,
``not_before - wall``, at least 0 and at most the backoff the task was given, so a wall clock
stepped meanwhile neither ends it early by more than it had left nor holds it longer.

The driver's contract, for every call::

    commands = book.handle(event, now=time.monotonic(), wall=time.time())
    records, others = split_commands(commands)
    journal.append(records)          # ONE transaction, durable, BEFORE anything else
    perform(others)                  # send Lease / CancelLease / Ack / Reject, report the rest

If ``journal.append`` raises, the master must stop without performing ``others``: the book has
already moved on in memory, and only a restart from the journal is consistent again.

Decisions the driver and the workers rely on:

- A task is LEASED while at least one copy runs. A copy that fails, expires or loses its
  worker costs an attempt only when it was the last copy running.
- Fail -> backoff (``JobPolicy.backoff``); an expired lease or a worker that left -> pending at
  once. Either way, the ``max_attempts``-th lost attempt dead-letters the task.
- A Complete is accepted as the commit when the task is not final yet, even from a lease that
  has since ended (expired, requeued, or issued before a master restart): outputs are committed
  by an atomic rename keyed by task id, so the work is valid and redoing it would only waste a
  worker. Running copies of the task are cancelled. The only check on such an old lease is that
  its id is not above the task's last lease id (journaled); a higher id is rejected.
  A Complete for a done task is acked DUPLICATE; for a cancelled task, IGNORED.
- A committed output is the truth: a Complete for a dead-lettered task (its lease expired or
  its worker was cut off while it committed) makes it done, and a job that ended failed only
  because of such tasks ends done after all (a new JobRecord and JobFinished).
- ``RetryDead`` (an operator's ``troupe ctl retry``, ``troupe run --retry-dead``) puts a job's
  dead tasks back to pending with no attempts counted, each a TaskRecord, and a job that ended
  failed runs again (a JobRecord). Their last lease ids stay, so an old copy's late Complete
  still commits. A cancelled job is refused: what a cancel stopped stays stopped.
- A task is leased only to a worker that runs its kind (``WorkerJoined.kinds``, empty for
  every kind). A Decline (the worker did not run it after all) puts the task back without
  counting an attempt, and that worker is never given that kind again.
- A Fail or Renew from a lease that has ended changes nothing (its attempt was counted when
  the lease ended): Fail is acked IGNORED, Renew rejected so the worker drops the task.
- A master restart keeps each leased task's last lease (``TaskTables.restore``): held over,
  by no worker the book knows, until a Renew or report names its lease id, whose sender then
  holds it (the lease id went to that worker alone), registered or not yet (a busy worker
  renews before it asks for work; the row it registers with takes the lease; until then its
  death, a WorkerLeft (of the pid its Renew said, where both say one) or its node's NodeDead,
  requeues the lease at once, as does a WorkerJoined of its id from another process than its
  Renew said, ``pid``). Its lease runs
  ``lease_s`` from the first event after the restart; one that no worker named by then goes
  back to pending with no attempt counted. Older copies of the task are not held over: their
  Renew is refused (the newest copy runs on), their Complete commits as above.
- A WorkerJoined of a registered worker's id is that worker leaving and joining again: its
  leases go back as a WorkerLeft's would (reason ``rejoined``); unless both say the same
  ``pid``: then it is the same process registering again (its first registration was answered
  after it gave up waiting, and it sent it again), and the new row keeps its leases.
- ``RequestTask.free_slots`` is capped by the slots the book itself sees free, plus the
  worker's ``prefetch`` (``WorkerJoined.prefetch``) when the request allows leases ahead.
- Prefetch: a worker whose slots are all leased may hold up to ``prefetch`` more leases, each
  waiting in the worker for a slot. A lease ahead is an ordinary lease (journaled, renewed,
  requeued when its worker leaves or it expires; the Complete commit rule alone decides what
  is done), must fit the worker's whole resources, and is never a backup copy: a backup exists
  to overtake a straggler, and one queued behind a running copy would overtake nothing. A
  worker gives back a lease ahead that waited too long (``Decline.given_back``): the task goes
  back without an attempt counted, as an unseen one does. When a worker leaves, its leases
  beyond its oldest ``slots`` (by lease id: a worker starts them in the order granted) never
  started, and go back without an attempt counted too.
- A task fits a worker when the worker has a free slot and enough un-leased CPU and GPUs
  (``WorkerJoined.resources`` is the worker's whole share; a GPU task never goes to a worker
  without a GPU).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from troupe.runtime.library_logging import get_logger

from .book_jobs import JobSteps
from .book_reports import WorkerReports
from .book_rows import LeaseSlot, Task, Worker
from .book_workers import WorkerMembership
from .scheduling import pick_task
from .speculation import pick_backup
from .state import (
    CancelJob,
    Command,
    Complete,
    Decline,
    DrainNode,
    Event,
    Fail,
    Lease,
    NodeDead,
    Record,
    Renew,
    RequestTask,
    RetryDead,
    SchedulerTick,
    SubmitJob,
    TaskState,
    UndrainNode,
    WorkerJoined,
    WorkerLeft,
)

__all__ = ["TaskBook", "split_commands"]

log = get_logger(__name__)

LEASED, FAILED = TaskState.LEASED, TaskState.FAILED


def split_commands(commands: Iterable[Command]) -> tuple[list[Record], list[Command]]:
    """Split one ``handle`` result into the records to persist first and everything else."""
    records: list[Record] = []
    others: list[Command] = []
    for command in commands:
        if isinstance(command, Record):
            records.append(command)
        else:
            others.append(command)
    return records, others


class TaskBook(JobSteps, WorkerReports, WorkerMembership):
    """Jobs, tasks, workers and leases of one master; see the module docstring for the rules.

    The read-outs (``statistics``, ``worker_load``, ``jobs``, ``dead_letters``, ``task``),
    ``restore`` and ``fold`` come from :class:`~troupe.runtime.tasks.task_tables.TaskTables`;
    the transitions from its parts: jobs (:mod:`~troupe.runtime.tasks.book_jobs`), the workers'
    reports (:mod:`~troupe.runtime.tasks.book_reports`), workers and nodes
    (:mod:`~troupe.runtime.tasks.book_workers`), the leases a restart held over
    (:mod:`~troupe.runtime.tasks.book_held_over`), on the moves they share
    (:mod:`~troupe.runtime.tasks.book_moves`). Leasing and the clocks are here.
    """

    # ------------------------------------------------------------------ entry points

    def handle(self, event: Event, now: float, wall: float | None = None) -> list[Command]:
        """Apply one event at time ``now`` and return the commands for the driver.

        Args:
            event: one of the events of :mod:`troupe.runtime.tasks.state`.
            now: monotonic seconds: leases, backoffs and running times are measured on it
                (``Lease.deadline`` and ``Ack.deadline`` are on it too).
            wall: wall seconds at the same instant, for what is journaled or shown as a time
                (``submitted_at``, ``not_before``); None: ``now`` (one clock for both, as a
                test may drive).

        Returns:
            Commands in order. Every :class:`Record` must be persisted, in one transaction,
            before any other command is performed.

        Raises:
            TypeError: ``event`` is not a task-book event.
        """
        if wall is None:
            wall = now
        if self._restored_backoffs:
            self._rebase_backoffs(now, wall)
        if self._restored_leases:
            self._start_held_over(now)
        out: list[Command] = []
        match event:
            case RequestTask():
                self._request(event, now, out)
            case Renew():
                self._renew(event, now, out)
            case Complete():
                self._complete(event, now, out)
            case Fail():
                self._fail(event, now, wall, out)
            case Decline():
                self._decline(event, out)
            case SchedulerTick():
                self._release_backoffs(now, out)
                self._expire(now, out)
            case SubmitJob():
                self._submit(event, wall, out)
            case WorkerJoined():
                self._worker_joined(event, now, out)
            case WorkerLeft():
                self._worker_left(event, now, out)
            case NodeDead():
                self._node_dead(event, now, out)
            case CancelJob():
                self._cancel(event, out)
            case RetryDead():
                self._retry_dead(event, wall, out)
            case DrainNode():
                self._draining.add(event.node_id)
                self._drain_waiting.add(event.node_id)
            case UndrainNode():
                self._draining.discard(event.node_id)
                self._drain_waiting.discard(event.node_id)
            case _:
                raise TypeError(f"not a task-book event: {event!r}")
        if self._drain_waiting:
            self._report_drained(out)
        return out

    # ------------------------------------------------------------------ leasing

    def _request(self, ev: RequestTask, now: float, out: list[Command]) -> None:
        worker = self._workers.get(ev.worker_id)
        if worker is None:
            return self._reject(ev, f"unknown worker {ev.worker_id!r}; send WorkerJoined", out)
        self._release_backoffs(now, out)
        if worker.node_id in self._draining:
            return
        ahead = worker.prefetch if ev.prefetch else 0
        for _ in range(min(ev.free_slots, worker.slots + ahead - len(worker.leases))):
            if len(worker.leases) >= worker.slots:  # a lease ahead: never a backup (see module)
                task = pick_task(worker, self._running, self._node_can_take, ahead=True)
                if task is None:
                    break
                self._lease(task, worker, now, False, out)
                continue
            task, backup = pick_task(worker, self._running, self._node_can_take), False
            if task is None:
                task, backup = pick_backup(worker, self._running, now), True
                if task is None:
                    break
            self._lease(task, worker, now, backup, out)

    def _lease(self, task: Task, worker: Worker, now: float, backup: bool, out: list[Command]) -> None:
        job = task.job
        lease = LeaseSlot(self._next_lease, task, worker, now, now + job.policy.lease_s, backup)
        self._next_lease += 1
        task.copies[lease.lease_id] = lease
        task.last_lease_id = lease.lease_id
        worker.hold(lease)
        self._leases[lease.lease_id] = lease
        heapq.heappush(self._expiry, (lease.deadline, lease.lease_id))
        if task.state is not LEASED:  # it joins job.leased now (see pick_backup)
            task.leased_at = now
            self._set_state(task, LEASED)
        self._spec_launched += backup
        spec = task.spec
        out.append(self._record(task))
        out.append(
            Lease(
                worker.worker_id,
                spec.task_id,
                lease.lease_id,
                job.job_id,
                spec.kind,
                spec.seed,
                spec.refs,
                lease.deadline,
                task.attempts + 1,
                backup,
            )
        )

    # ------------------------------------------------------------------ time

    def _expire(self, now: float, out: list[Command]) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            deadline, lease_id = heapq.heappop(self._expiry)
            lease = self._leases.get(lease_id)
            if lease is None or lease.deadline != deadline:
                continue  # ended or renewed since
            self._drop_lease(lease)
            if lease.worker is self._unclaimed:
                self._held_over_expired(lease, out)
                continue
            out.append(self._cancel_lease(lease, "lease expired"))
            lease_s = lease.task.job.policy.lease_s
            worker = lease.worker.worker_id
            error = f"lease {lease_id} expired on worker {worker} (no Renew within {lease_s}s)"
            # The master's log says so (``logs tail --master``): the worker's says only that
            # its copy was cancelled, and a hung worker says nothing.
            log.info(
                "lease_expired",
                task_id=lease.task.spec.task_id,
                lease_id=lease_id,
                worker=worker,
                job_id=lease.task.job.job_id,
                lease_s=lease_s,
            )
            self._copy_lost(lease.task, now, error, "", out)

    def _release_backoffs(self, now: float, out: list[Command]) -> None:
        while self._backoff and self._backoff[0][0] <= now:
            _, seq, task_id, not_before = heapq.heappop(self._backoff)
            task = self._tasks.get(task_id)  # a cancelled job's, compacted since (fold), is gone
            if task is not None and task.seq == seq and (task.state, task.not_before) == (FAILED, not_before):
                self._enqueue(task)
                out.append(self._record(task))

    def _rebase_backoffs(self, now: float, wall: float) -> None:
        """Put the backoffs a restart restored (their ``not_before`` on the wall clock of the
        journal) on this process's monotonic clock: what remains of each, at least 0 and at
        most the backoff the task was given (a wall clock stepped back since must not hold a
        retry longer than its own backoff; see the module docstring)."""
        for task in self._restored_backoffs:
            if task.state is FAILED:
                remaining = min(max(task.not_before - wall, 0.0), task.job.policy.backoff(task.attempts))
                heapq.heappush(self._backoff, (now + remaining, task.seq, task.spec.task_id, task.not_before))
        self._restored_backoffs = []
