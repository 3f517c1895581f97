"""The task book's live rows: :class:`Task`, :class:`LeaseSlot`, :class:`Job` and :class:`Worker`.

They are mutable, and nothing outside the book sees them. A worker's resource accounting goes
with its row: :func:`fits` (with :data:`EPSILON`, since CPU amounts are float sums) is what
``Worker.can_take`` asks, and placement asks it too. The rows sit apart from the tables that
hold them (:mod:`troupe.runtime.tasks.task_tables`) and the placement that reads them
(:mod:`troupe.runtime.tasks.scheduling`), both of which import them.
"""

from __future__ import annotations

from .pending_queue import PendingQueue
from .speculation import RunningMedian
from .state import JobPolicy, JobState, Resources, TaskSpec, TaskState

__all__ = ["EPSILON", "Job", "LeaseSlot", "Task", "Worker", "fits"]

EPSILON = 1e-9  # CPU amounts are floats; sums of fractions must not refuse an exact fit


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
        "pid",
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
        pid: int = 0,
    ) -> None:
        self.worker_id = worker_id
        self.node_id = node_id
        self.pid = pid  # its process, where it said (0: not)
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
