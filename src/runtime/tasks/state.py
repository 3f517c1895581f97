"""The vocabulary of task bookkeeping: states, specs, events, commands and journal records.

Everything here is a frozen value. :class:`~troupe.runtime.tasks.book.TaskBook` consumes the
events, returns the commands, and a driver performs them::

    events   SubmitJob  WorkerJoined  WorkerLeft  NodeDead  RequestTask  Renew
             Complete  Fail  Decline  SchedulerTick  CancelJob  RetryDead  DrainNode  UndrainNode
    commands Record (persist first!)  Lease  CancelLease  Ack  Reject  NodeDrained  JobFinished
    records  JobSubmitted  JobRecord  TaskRecord      (the payload of a Record command)

Task life cycle (a task is LEASED while at least one copy of it runs)::

    PENDING --lease--> LEASED --complete--> DONE
       ^                 |  \\--fail (last copy)--> FAILED --backoff over--> PENDING
       |                 |--expired / worker left (last copy)--> PENDING
       |                 |--attempts == max_attempts--> DEAD --late complete--> DONE
       |<----------------------retry dead (attempts reset)-------/
       |                 \\--decline (last copy; no attempt counted)--> PENDING
       \\--- any non-final state --cancel job--> CANCELLED

A task is leased only to a worker that runs its kind and has the resources it needs; a task
that no registered worker could take waits pending, and :class:`Waiting` says why.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from troupe.runtime.errors import ConfigError

# Defined with the worker's getter config, which a worker imports without this module's events.
from .getter_config import MAX_PREFETCH

__all__ = [
    "FINAL_STATES",
    "MAX_PREFETCH",
    "Ack",
    "AckOutcome",
    "CancelJob",
    "CancelLease",
    "Command",
    "Complete",
    "DeadLetter",
    "Decline",
    "DrainNode",
    "Event",
    "Fail",
    "JobFinished",
    "JobPolicy",
    "JobRecord",
    "JobState",
    "JobSubmitted",
    "JobSummary",
    "JobTasksCancelled",
    "Lease",
    "NodeDead",
    "NodeDrained",
    "Record",
    "Reject",
    "Renew",
    "RequestTask",
    "Resources",
    "RetryDead",
    "SchedulerTick",
    "Speculation",
    "SubmitJob",
    "TaskBookStats",
    "TaskInfo",
    "TaskRecord",
    "TaskSpec",
    "TaskState",
    "UndrainNode",
    "Waiting",
    "WorkerJoined",
    "WorkerLeft",
    "WorkerLoad",
]


class TaskState(enum.StrEnum):
    """Where a task is in its life cycle (see the module docstring)."""

    PENDING = "pending"  # waiting for a worker to ask
    LEASED = "leased"  # one or more copies run under a lease
    FAILED = "failed"  # its last attempt failed; it waits out its backoff, then is pending again
    DONE = "done"
    DEAD = "dead"  # dead-lettered after max_attempts, with its last error
    CANCELLED = "cancelled"


FINAL_STATES = frozenset({TaskState.DONE, TaskState.DEAD, TaskState.CANCELLED})


class JobState(enum.StrEnum):
    """A job is RUNNING until every task is final; then DONE, FAILED (some dead) or CANCELLED."""

    RUNNING = "running"
    DONE = "done"  # every task done
    FAILED = "failed"  # every task final, at least one dead-lettered
    CANCELLED = "cancelled"


class AckOutcome(enum.StrEnum):
    """What an :class:`Ack` tells the worker about its Complete, Fail or Renew."""

    COMMITTED = "committed"  # this Complete made the task done
    DUPLICATE = "duplicate"  # the task was already done: nothing changed
    RECORDED = "recorded"  # the Fail was recorded
    IGNORED = "ignored"  # the task is cancelled, or the lease had already ended
    RETURNED = "returned"  # the Decline put the task back; no attempt was counted
    RENEWED = "renewed"  # the lease runs until ``Ack.deadline`` (the master's monotonic clock)


# --------------------------------------------------------------------------- specs and policy


@dataclass(frozen=True, slots=True)
class Resources:
    """CPU and GPU amounts: what a task needs, or what a worker offers.

    Attributes:
        cpu: CPU cores (fractions allowed).
        gpu: whole GPUs.
    """

    cpu: float = 1.0
    gpu: int = 0


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task's immutable metadata; the full context is loaded lazily by the worker.

    Attributes:
        task_id: unique across all jobs; outputs are committed under it.
        kind: which handler runs it.
        seed: the task's random seed.
        refs: content-store references the worker loads the context from.
        needs: resources one copy of the task holds while it runs.
        locality: node id that already holds its context; a hint, never a hard constraint.
    """

    task_id: str
    kind: str
    seed: int
    refs: Mapping[str, str] = field(default_factory=dict)
    needs: Resources = Resources()
    locality: str | None = None


@dataclass(frozen=True, slots=True)
class Speculation:
    """When to launch backup copies of slow tasks in a job's tail.

    Attributes:
        enabled: launch backups at all.
        factor: a task is slow once it has run longer than ``factor`` x the job's median.
        min_runtime_s: and longer than this, so that short jobs never speculate.
        max_copies: backup copies per task, on top of the first.
    """

    enabled: bool = True
    factor: float = 1.5
    min_runtime_s: float = 30.0
    max_copies: int = 1

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ConfigError(f"speculation.factor must be >= 1.0, got {self.factor}")
        if not self.min_runtime_s >= 0.0:
            raise ConfigError(f"speculation.min_runtime_s must be >= 0, got {self.min_runtime_s}")
        if self.max_copies < 0:
            raise ConfigError(f"speculation.max_copies must be >= 0, got {self.max_copies}")


@dataclass(frozen=True, slots=True)
class JobPolicy:
    """Retries, leases, backoff, priority and speculation of one job.

    Attributes:
        max_attempts: failed attempts before a task is dead-lettered.
        lease_s: a lease lasts this long unless renewed.
        backoff_base_s: after the n-th failure a task waits ``base * 2**(n-1)`` seconds...
        backoff_max_s: ...but never longer than this.
        priority: higher runs first; equal priorities run in submit order.
        speculation: backup copies for the tail.
    """

    max_attempts: int = 3
    lease_s: float = 60.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    priority: int = 0
    speculation: Speculation = Speculation()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not self.lease_s > 0.0:
            raise ConfigError(f"lease_s must be > 0, got {self.lease_s}")
        if not 0.0 <= self.backoff_base_s <= self.backoff_max_s:
            raise ConfigError(
                f"need 0 <= backoff_base_s <= backoff_max_s, got {self.backoff_base_s} and "
                f"{self.backoff_max_s}"
            )

    def backoff(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt (1-based)."""
        return min(self.backoff_base_s * 2.0 ** (attempts - 1), self.backoff_max_s)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class SubmitJob:
    """Add a job; its task ids must be new. Rejected if the job id is taken or it has no tasks."""

    job_id: str
    tasks: tuple[TaskSpec, ...] | list[TaskSpec]
    policy: JobPolicy = JobPolicy()
    name: str = ""


@dataclass(frozen=True, slots=True)
class WorkerJoined:
    """A worker process can take tasks. A known worker id re-joining first leaves."""

    worker_id: str
    node_id: str
    resources: Resources
    slots: int
    kinds: frozenset[str] = frozenset()  # the task kinds it runs; empty: every kind
    # leases it may hold beyond its slots, waiting in the worker for a slot to free
    prefetch: int = 0
    pid: int = 0  # its process (0: not said): another than the one that renewed its leases is new


@dataclass(frozen=True, slots=True)
class WorkerLeft:
    """A worker died or was stopped: its leased tasks go back to pending at once."""

    worker_id: str
    reason: str = ""
    # the process that left (0: not said): a worker not registered again since a restart that
    # named its leases from another pid is another process of the name, and keeps them
    pid: int = 0


@dataclass(frozen=True, slots=True)
class NodeDead:
    """Every worker of the node left: it went silent, or it said it stops (``left``).

    A node that left on purpose keeps its drain: drained, stopped and started again (an
    upgrade), it takes no task until ``troupe ctl undrain``. A silent one's drain ends.
    """

    node_id: str
    left: bool = False


@dataclass(frozen=True, slots=True)
class RequestTask:
    """A worker pulls: lease it up to ``free_slots`` tasks.

    ``prefetch``: it may be leased tasks beyond its slots (up to the ``prefetch`` it joined
    with); the driver says False while another worker waits idle for a task.
    """

    worker_id: str
    free_slots: int
    prefetch: bool = True


@dataclass(frozen=True, slots=True)
class Renew:
    """Extend a lease by the job's ``lease_s`` from now.

    ``node_id``: the sender's node, where it says (a worker that names a lease held over a
    master restart before it registers again is known by it: its node's death requeues it).
    ``pid``: the sender's process, where it says (a process of that name that registers then is
    the same worker registering again, and takes the lease; another is new, and requeues it).
    """

    worker_id: str
    task_id: str
    lease_id: int
    node_id: str = ""
    pid: int = 0


@dataclass(frozen=True, slots=True)
class Complete:
    """A copy finished and committed its output under ``result_ref``.

    ``run_s``: how long the copy ran, as the worker measured it (None: unknown, and the book
    takes the time since the lease was granted; a lease ahead waited for a slot first).
    """

    worker_id: str
    task_id: str
    lease_id: int
    result_ref: str
    run_s: float | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """A copy raised; ``error`` and ``traceback`` end up in the dead letter if it was the last."""

    worker_id: str
    task_id: str
    lease_id: int
    error: str
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class Decline:
    """A copy was not run: the worker does not run the task's kind (its advertised kinds were
    wrong). The task goes back to pending without an attempt counted, and the worker is not
    given that kind again.

    ``unseen``: the worker never received the lease (the reply that carried it was lost, say
    while its host's link was cut; the master tells from the leases the worker says it holds).
    The task goes back the same way, and the worker may be given its kind again.

    ``given_back``: a prefetched copy waited in the worker too long for a slot and was never
    started; it goes back the same way as an unseen one.
    """

    worker_id: str
    task_id: str
    lease_id: int
    reason: str = ""
    unseen: bool = False
    given_back: bool = False


@dataclass(frozen=True, slots=True)
class SchedulerTick:
    """Time passed (the ``now`` given to ``handle``): expire leases, end backoffs."""


@dataclass(frozen=True, slots=True)
class CancelJob:
    """Cancel every task of the job that is not final; running copies are told to stop."""

    job_id: str


@dataclass(frozen=True, slots=True)
class RetryDead:
    """Run the job's dead-lettered tasks again: each goes back to pending with no attempts
    counted and its last error cleared, and a job that had ended failed runs again. A job with
    none changes nothing; a cancelled job is refused (its tasks do not run again)."""

    job_id: str


@dataclass(frozen=True, slots=True)
class DrainNode:
    """Give the node's workers no new tasks; answer NodeDrained once it runs none."""

    node_id: str


@dataclass(frozen=True, slots=True)
class UndrainNode:
    """End a drain: the node's workers (those that come back, too) get tasks again."""

    node_id: str


Event = (
    SubmitJob
    | WorkerJoined
    | WorkerLeft
    | NodeDead
    | RequestTask
    | Renew
    | Complete
    | Fail
    | Decline
    | SchedulerTick
    | CancelJob
    | RetryDead
    | DrainNode
    | UndrainNode
)

# --------------------------------------------------------------------------- journal records


@dataclass(frozen=True, slots=True)
class JobRecord:
    """The durable row of a job."""

    job_id: str
    name: str
    seq: int
    state: JobState
    policy: JobPolicy
    submitted_at: float


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """The durable, mutable part of a task's row (its spec is written once, at submit).

    ``last_lease_id`` is the highest lease id ever issued for the task: after a restart it
    bounds which old leases may still complete the task, and it keeps lease ids unique.
    """

    task_id: str
    job_id: str
    state: TaskState
    attempts: int
    not_before: float
    last_lease_id: int
    result_ref: str | None
    error: str | None
    traceback: str | None


@dataclass(frozen=True, slots=True)
class JobTasksCancelled:
    """Every task of a cancelled job that was not final yet is cancelled, nothing else of its
    row changed: one record for a big job's tasks (their ids run ``first_task_id`` to
    ``last_task_id`` in the journal's order) instead of one per task. ``count``: how many."""

    job_id: str
    first_task_id: str
    last_task_id: str
    count: int


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    """A new job and all its tasks, every task pending with no attempts."""

    job: JobRecord
    tasks: tuple[TaskSpec, ...]


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True)
class Record:
    """A state change. The driver persists every Record of one ``handle`` call, in one
    transaction, BEFORE it performs any other command of that call."""

    entry: JobSubmitted | JobRecord | TaskRecord | JobTasksCancelled


@dataclass(frozen=True, slots=True)
class Lease:
    """Send the task to the worker; it must Renew before ``deadline`` (the master's monotonic
    clock: the worker is told what remains, ``ttl``) or lose the lease."""

    worker_id: str
    task_id: str
    lease_id: int
    job_id: str
    kind: str
    seed: int
    refs: Mapping[str, str]
    deadline: float
    attempt: int
    backup: bool


@dataclass(frozen=True, slots=True)
class CancelLease:
    """Tell the worker to stop the copy: another copy won, the lease expired, or the job ended."""

    worker_id: str
    task_id: str
    lease_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Ack:
    """Answer a worker's Complete, Fail or Renew."""

    worker_id: str
    task_id: str
    lease_id: int
    outcome: AckOutcome
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """The event was refused and changed nothing; ``reason`` says why and what to do."""

    event: Event
    reason: str


@dataclass(frozen=True, slots=True)
class NodeDrained:
    """The draining node runs no task any more; it can be stopped."""

    node_id: str


@dataclass(frozen=True, slots=True)
class JobFinished:
    """Every task of the job is final (or the job was cancelled)."""

    job_id: str
    state: JobState


Command = Record | Lease | CancelLease | Ack | Reject | NodeDrained | JobFinished

# --------------------------------------------------------------------------- read-outs


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """Live load of one worker: ``used`` of its ``slots`` hold a lease."""

    worker_id: str
    node_id: str
    slots: int
    used: int
    draining: bool

    @property
    def load(self) -> float:
        """Fraction of slots in use."""
        return self.used / self.slots if self.slots else 0.0


@dataclass(frozen=True, slots=True)
class Waiting:
    """Pending tasks of one job that no registered worker could take, and why.

    Attributes:
        kind: their task kind.
        needs: what each of them needs.
        tasks: how many of the job's pending tasks are in this case.
        reason: e.g. ``waiting for kind render: no live worker runs it``.
    """

    kind: str
    needs: Resources
    tasks: int
    reason: str


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A job, its task counts by state, and what its stuck pending tasks wait for."""

    job_id: str
    name: str
    state: JobState
    priority: int
    submitted_at: float
    total: int
    counts: Mapping[TaskState, int]
    waiting: tuple[Waiting, ...] = ()
    # The references its first task got ([job.refs]); none once compaction dropped its tasks.
    refs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A task that failed ``attempts`` times, with its last error."""

    task_id: str
    job_id: str
    attempts: int
    error: str
    traceback: str


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """One task as the book sees it now."""

    task_id: str
    job_id: str
    state: TaskState
    attempts: int
    copies: int
    not_before: float
    result_ref: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class TaskBookStats:
    """A snapshot of the book.

    Attributes:
        tasks: count of tasks by state, over all jobs.
        jobs: per job id, count of its tasks by state.
        workers: per worker id, its live load.
        leases_outstanding: leases (copies) running now.
        speculative_launched: backup copies ever started.
        speculative_won: backup copies whose Complete came first.
    """

    tasks: Mapping[TaskState, int]
    jobs: Mapping[str, Mapping[TaskState, int]]
    workers: Mapping[str, WorkerLoad]
    leases_outstanding: int
    speculative_launched: int
    speculative_won: int
