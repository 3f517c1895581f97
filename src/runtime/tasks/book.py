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
  death, a WorkerLeft or its node's NodeDead, requeues the lease at once). Its lease runs
  ``lease_s`` from the first event after the restart; one that no worker named by then goes
  back to pending with no attempt counted. Older copies of the task are not held over: their
  Renew is refused (the newest copy runs on), their Complete commits as above.
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
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

from troupe.runtime.library_logging import get_logger

from .book_rows import Job, LeaseSlot, Task, Worker
from .journal_bulk import BULK_TASKS
from .scheduling import pick_task
from .speculation import pick_backup
from .state import (
    FINAL_STATES,
    Ack,
    AckOutcome,
    CancelJob,
    CancelLease,
    Command,
    Complete,
    Decline,
    DrainNode,
    Event,
    Fail,
    JobFinished,
    JobRecord,
    JobState,
    JobSubmitted,
    JobTasksCancelled,
    Lease,
    NodeDead,
    NodeDrained,
    Record,
    Reject,
    Renew,
    RequestTask,
    Resources,
    RetryDead,
    SchedulerTick,
    SubmitJob,
    TaskRecord,
    TaskSpec,
    TaskState,
    UndrainNode,
    WorkerJoined,
    WorkerLeft,
)
from .task_tables import TaskTables

__all__ = ["TaskBook", "split_commands"]

log = get_logger(__name__)

PENDING, LEASED, FAILED = TaskState.PENDING, TaskState.LEASED, TaskState.FAILED
DONE, DEAD, CANCELLED = TaskState.DONE, TaskState.DEAD, TaskState.CANCELLED


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


class TaskBook(TaskTables):
    """Jobs, tasks, workers and leases of one master; see the module docstring for the rules.

    The read-outs (``statistics``, ``worker_load``, ``jobs``, ``dead_letters``, ``task``),
    ``restore`` and ``fold`` come from :class:`~troupe.runtime.tasks.task_tables.TaskTables`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._drain_waiting: set[str] = set()  # draining nodes not yet reported drained
        self._expiry: list[tuple[float, int]] = []  # (deadline, lease id); stale once renewed
        # (due on the monotonic clock, seq, task id, its not_before on the wall clock)
        self._backoff: list[tuple[float, int, str, float]] = []

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

    # ------------------------------------------------------------------ jobs

    def _submit(self, ev: SubmitJob, wall: float, out: list[Command]) -> None:
        specs = tuple(ev.tasks)
        if ev.job_id in self._jobs:
            return self._reject(ev, f"job id {ev.job_id!r} is taken; submit under a new id", out)
        if not specs:
            return self._reject(ev, f"job {ev.job_id!r} has no tasks; give it at least one", out)
        problem = _first_problem(specs, self._tasks.keys())
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

    def _maybe_finish(self, job: Job, out: list[Command]) -> None:
        c = job.counts
        if job.state is JobState.RUNNING and not (c[PENDING] or c[LEASED] or c[FAILED]):
            self._finish(job, JobState.FAILED if c[DEAD] else JobState.DONE, out)

    def _finish(self, job: Job, state: JobState, out: list[Command]) -> None:
        job.state = state
        self._running.remove(job)
        out.append(Record(self._job_record(job)))
        out.append(JobFinished(job.job_id, state))
        log.info("job_finished", job_id=job.job_id, state=str(state), dead=job.counts[DEAD])

    # ------------------------------------------------------------------ workers and nodes

    def _worker_joined(self, ev: WorkerJoined, now: float, out: list[Command]) -> None:
        if ev.slots < 1 or ev.resources.cpu < 0 or ev.resources.gpu < 0:
            return self._reject(ev, "a worker needs slots >= 1 and resources >= 0", out)
        if ev.worker_id in self._workers:
            self._worker_left(WorkerLeft(ev.worker_id, "rejoined"), now, out)
        worker = Worker(
            ev.worker_id, ev.node_id, ev.resources, ev.slots, frozenset(ev.kinds), max(ev.prefetch, 0)
        )
        self._workers[ev.worker_id] = worker
        self._nodes.setdefault(ev.node_id, set()).add(ev.worker_id)
        held = self._unregistered.pop(ev.worker_id, None)
        if held is not None:  # it took leases held over a restart before it registered
            for lease in list(held.leases.values()):
                self._move_lease(lease, worker)

    def _worker_left(self, ev: WorkerLeft, now: float, out: list[Command]) -> None:
        worker = self._workers.pop(ev.worker_id, None)
        if worker is None:
            claimant = self._unregistered.pop(ev.worker_id, None)
            if claimant is None:
                return self._reject(ev, f"unknown worker {ev.worker_id!r}", out)
            # Its slots are unknown (it never registered): each lease it named may have run, so
            # each costs an attempt, as its expiry would have.
            return self._leases_lost(claimant, ev.reason, len(claimant.leases), now, out)
        self._leases_lost(worker, ev.reason, worker.slots, now, out)
        node = self._nodes[worker.node_id]
        node.discard(ev.worker_id)
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

    def _drop_lease(self, lease: LeaseSlot) -> None:
        del lease.task.copies[lease.lease_id]
        del self._leases[lease.lease_id]
        worker = lease.worker
        worker.release(lease)
        if not worker.leases and self._unregistered.get(worker.worker_id) is worker:
            del self._unregistered[worker.worker_id]

    def _move_lease(self, lease: LeaseSlot, worker: Worker) -> None:
        lease.worker.release(lease)
        lease.worker = worker
        worker.hold(lease)

    def _claim(self, lease: LeaseSlot, worker_id: str, node_id: str = "") -> None:
        """A lease held over a restart is named by a worker (a Renew or a report): the lease id
        went to that worker alone, so it is the holder, registered again or not yet. One not
        registered yet holds it under its id and its node (``node_id``, which a Renew says):
        its death (``WorkerLeft``, ``NodeDead``) requeues it at once, as a registered holder's."""
        holder = self._workers.get(worker_id)
        if holder is None:
            holder = self._unregistered.get(worker_id)
            if holder is None:
                holder = self._unregistered[worker_id] = Worker(worker_id, node_id, Resources(0.0, 0), 1)
            holder.node_id = holder.node_id or node_id
        self._move_lease(lease, holder)
        log.info(
            "held_over_lease_claimed",
            task_id=lease.task.spec.task_id,
            lease_id=lease.lease_id,
            worker=worker_id,
            registered=worker_id in self._workers,
        )

    # ------------------------------------------------------------------ worker reports

    def _renew(self, ev: Renew, now: float, out: list[Command]) -> None:
        lease = self._leases.get(ev.lease_id)
        if lease is None or lease.task.spec.task_id != ev.task_id:
            return self._reject(
                ev,
                f"lease {ev.lease_id} of task {ev.task_id!r} is no longer "
                "valid (expired, requeued or finished); drop the task",
                out,
            )
        if lease.worker is self._unclaimed:
            self._claim(lease, ev.worker_id, ev.node_id)
        elif lease.worker.worker_id != ev.worker_id:
            return self._reject(
                ev,
                f"lease {ev.lease_id} belongs to worker {lease.worker.worker_id!r}, not {ev.worker_id!r}",
                out,
            )
        lease.deadline = now + lease.task.job.policy.lease_s
        heapq.heappush(self._expiry, (lease.deadline, lease.lease_id))
        out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.RENEWED, lease.deadline))

    def _check_report(
        self, ev: Complete | Fail | Decline, out: list[Command]
    ) -> tuple[Task, LeaseSlot | None] | None:
        """Checks common to the reports; None when they answered the event already."""
        task = self._tasks.get(ev.task_id)
        if task is None:
            self._reject(ev, f"unknown task {ev.task_id!r}", out)
            return None
        if task.state is DEAD and isinstance(ev, Complete) and 1 <= ev.lease_id <= task.last_lease_id:
            return task, None  # its output is committed: the dead letter is overturned
        if task.state in FINAL_STATES:
            outcome = AckOutcome.DUPLICATE if task.state is DONE else AckOutcome.IGNORED
            out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, outcome))
            return None
        lease = task.copies.get(ev.lease_id)
        if lease is not None and lease.worker is self._unclaimed:
            self._claim(lease, ev.worker_id)
        if lease is None and not 1 <= ev.lease_id <= task.last_lease_id:
            self._reject(ev, f"lease {ev.lease_id} was never issued for task {ev.task_id!r}", out)
            return None
        if lease is not None and lease.worker.worker_id != ev.worker_id:
            self._reject(
                ev,
                f"lease {ev.lease_id} belongs to worker {lease.worker.worker_id!r}, not {ev.worker_id!r}",
                out,
            )
            return None
        return task, lease

    def _complete(self, ev: Complete, now: float, out: list[Command]) -> None:
        checked = self._check_report(ev, out)
        if checked is None:
            return
        task, winner = checked
        if task.state is DEAD:
            return self._overturn(task, ev, out)
        if winner is None:
            log.info("late_complete_accepted", task_id=ev.task_id, lease_id=ev.lease_id)
        else:
            # the copy's own run time: a lease ahead waited for a slot before it ran
            task.job.durations.add(now - winner.start if ev.run_s is None else ev.run_s)
            self._spec_won += winner.backup
        for lease in list(task.copies.values()):
            self._drop_lease(lease)
            if lease is not winner and lease.worker is not self._unclaimed:
                out.append(self._cancel_lease(lease, "another copy of the task finished first"))
        task.result_ref = ev.result_ref
        self._set_state(task, DONE)
        out.append(self._record(task))
        out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.COMMITTED))
        self._maybe_finish(task.job, out)

    def _overturn(self, task: Task, ev: Complete, out: list[Command]) -> None:
        """A dead-lettered task's copy committed after all: the task is done."""
        job = task.job
        task.result_ref = ev.result_ref
        self._set_state(task, DONE)
        out.append(self._record(task))
        out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.COMMITTED))
        log.warning("dead_letter_overturned", task_id=ev.task_id, lease_id=ev.lease_id, job_id=job.job_id)
        if job.state is JobState.FAILED and not job.counts[DEAD]:
            job.state = JobState.DONE  # it is no longer among the running: nothing to remove
            out.append(Record(self._job_record(job)))
            out.append(JobFinished(job.job_id, JobState.DONE))
            log.info("job_finished", job_id=job.job_id, state="done", overturned=True)
        else:
            self._maybe_finish(job, out)

    def _decline(self, ev: Decline, out: list[Command]) -> None:
        checked = self._check_report(ev, out)
        if checked is None:
            return
        task, lease = checked
        if lease is None:
            out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.IGNORED))
            return
        self._drop_lease(lease)
        if not (ev.unseen or ev.given_back):
            lease.worker.declined.add(task.spec.kind)
        if not task.copies and task.state is LEASED:
            self._enqueue(task)
            out.append(self._record(task))
        out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.RETURNED))
        # A prefetched lease given back is a lease ahead working as meant (it waited too long
        # in its worker for a slot): info, not the warning an unseen lease or a decline is.
        emit = log.info if ev.given_back and not ev.unseen else log.warning
        emit(
            "lease_unseen_returned"
            if ev.unseen
            else "prefetched_lease_given_back"
            if ev.given_back
            else "task_declined",
            task_id=ev.task_id,
            worker=ev.worker_id,
            kind=task.spec.kind,
            reason=ev.reason,
        )

    def _fail(self, ev: Fail, now: float, wall: float, out: list[Command]) -> None:
        checked = self._check_report(ev, out)
        if checked is None:
            return
        task, lease = checked
        if lease is None:  # that copy's attempt was settled when its lease ended
            out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.IGNORED))
            return
        self._drop_lease(lease)
        self._copy_lost(task, now, ev.error, ev.traceback, out, wall)
        out.append(Ack(ev.worker_id, ev.task_id, ev.lease_id, AckOutcome.RECORDED))

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

    def _start_held_over(self, now: float) -> None:
        """Start the leases a restart held over (see ``TaskTables.restore``) at the first event:
        each lasts its job's ``lease_s`` from now, and runs from now for speculation."""
        for lease in self._restored_leases:
            if lease.lease_id in self._leases:
                lease.start = lease.task.leased_at = now
                lease.deadline = now + lease.task.job.policy.lease_s
                heapq.heappush(self._expiry, (lease.deadline, lease.lease_id))
        self._restored_leases = []

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

    # ------------------------------------------------------------------ transitions

    def _copy_lost(
        self,
        task: Task,
        now: float,
        error: str,
        traceback: str,
        out: list[Command],
        failed_at: float | None = None,
    ) -> None:
        """A copy ended without a result; count the attempt if no other copy still runs.

        ``failed_at``: the wall time of a failure the task reported (it then backs off, and its
        ``not_before`` is journaled on the wall clock); None for a copy lost otherwise (an
        expired lease, a worker gone), which goes back to pending at once.
        """
        if task.copies or task.state is not LEASED:
            return
        task.attempts += 1
        task.error, task.traceback = error, traceback
        policy = task.job.policy
        if task.attempts >= policy.max_attempts:
            self._set_state(task, DEAD)
            out.append(self._record(task))
            log.warning("task_dead_lettered", task_id=task.spec.task_id, attempts=task.attempts, error=error)
            self._maybe_finish(task.job, out)
        elif failed_at is not None and policy.backoff(task.attempts) > 0:
            wait_s = policy.backoff(task.attempts)
            task.not_before = failed_at + wait_s
            self._set_state(task, FAILED)
            heapq.heappush(self._backoff, (now + wait_s, task.seq, task.spec.task_id, task.not_before))
            out.append(self._record(task))
        else:
            self._enqueue(task)
            out.append(self._record(task))

    def _enqueue(self, task: Task) -> None:
        self._set_state(task, PENDING)
        task.job.queue.push(task)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _job_record(job: Job) -> JobRecord:
        return JobRecord(job.job_id, job.name, job.seq, job.state, job.policy, job.submitted_at)

    @staticmethod
    def _record(task: Task) -> Record:
        return Record(
            TaskRecord(
                task.spec.task_id,
                task.job.job_id,
                task.state,
                task.attempts,
                task.not_before,
                task.last_lease_id,
                task.result_ref,
                task.error,
                task.traceback,
            )
        )

    @staticmethod
    def _cancel_lease(lease: LeaseSlot, reason: str) -> CancelLease:
        return CancelLease(lease.worker.worker_id, lease.task.spec.task_id, lease.lease_id, reason)

    @staticmethod
    def _reject(event: Event, reason: str, out: list[Command]) -> None:
        out.append(Reject(event, reason))
        log.info("event_rejected", event_type=type(event).__name__, reason=reason)


def _first_problem(specs: Sequence[TaskSpec], known: AbstractSet[str]) -> str:
    """What is wrong with a job's tasks, for the first task in order that is wrong: an id used
    twice (in the job, or by a task ``known`` already) or a negative resource; empty if none.

    Checked as a whole first (a million tasks in one submit), task by task only on a problem.
    """
    ids = [s.task_id for s in specs]
    needs = {id(s.needs): s.needs for s in specs}.values()
    if len(set(ids)) == len(ids) and known.isdisjoint(ids) and all(n.cpu >= 0 and n.gpu >= 0 for n in needs):
        return ""
    seen: set[str] = set()
    for spec in specs:
        if spec.task_id in seen or spec.task_id in known:
            return f"task id {spec.task_id!r} is used twice; ids must be unique across jobs"
        if spec.needs.cpu < 0 or spec.needs.gpu < 0:
            return f"task {spec.task_id!r} needs {spec.needs}; resources must be >= 0"
        seen.add(spec.task_id)
    return ""
