"""The task book, a pure state machine, driven with explicit times."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TypeVar

import pytest

from troupe.runtime.errors import ConfigError, TaskError
from troupe.runtime.tasks.book import TaskBook, split_commands
from troupe.runtime.tasks.state import (
    Ack,
    AckOutcome,
    CancelJob,
    CancelLease,
    Command,
    Complete,
    DrainNode,
    Event,
    Fail,
    JobFinished,
    JobPolicy,
    JobRecord,
    JobState,
    JobSubmitted,
    Lease,
    NodeDead,
    NodeDrained,
    Record,
    Reject,
    Renew,
    RequestTask,
    Resources,
    SchedulerTick,
    Speculation,
    SubmitJob,
    TaskRecord,
    TaskSpec,
    TaskState,
    WorkerJoined,
    WorkerLeft,
)

C = TypeVar("C")
NO_SPEC = JobPolicy(speculation=Speculation(enabled=False))
CPU = Resources(cpu=8, gpu=0)
GPU = Resources(cpu=8, gpu=1)


def specs(prefix: str, n: int) -> list[TaskSpec]:
    return [TaskSpec(f"{prefix}-{i}", "k", i) for i in range(n)]


def only(commands: Iterable[Command], kind: type[C]) -> list[C]:
    return [c for c in commands if isinstance(c, kind)]


def lease_ids(commands: Iterable[Command]) -> list[str]:
    return [c.task_id for c in only(commands, Lease)]


def make_book(*workers: tuple[str, str, Resources, int]) -> TaskBook:
    book = TaskBook()
    for worker_id, node, resources, slots in workers:
        assert book.handle(WorkerJoined(worker_id, node, resources, slots), 0.0) == []
    return book


def complete(book: TaskBook, lease: Lease, now: float) -> list[Command]:
    return book.handle(Complete(lease.worker_id, lease.task_id, lease.lease_id, "ref"), now)


def fail(book: TaskBook, lease: Lease, now: float, error: str = "boom") -> list[Command]:
    return book.handle(Fail(lease.worker_id, lease.task_id, lease.lease_id, error, f"tb:{error}"), now)


# ------------------------------------------------------------------ placement


def test_tasks_are_leased_fifo_by_job_submit_order() -> None:
    """Tasks go out in submit order: every task of an older job before a newer job's."""
    book = make_book(("w", "n", CPU, 1))
    book.handle(SubmitJob("a", specs("a", 2), NO_SPEC), 0.0)
    book.handle(SubmitJob("b", specs("b", 2), NO_SPEC), 1.0)
    order = []
    for step in range(4):
        (lease,) = only(book.handle(RequestTask("w", 1), 2.0 + step), Lease)
        order.append(lease.task_id)
        complete(book, lease, 2.5 + step)
    assert order == ["a-0", "a-1", "b-0", "b-1"]


def test_higher_priority_job_goes_first() -> None:
    """A job with a higher priority is served before an older job with a lower one."""
    book = make_book(("w", "n", CPU, 8))
    book.handle(SubmitJob("low", specs("low", 1), NO_SPEC), 0.0)
    book.handle(SubmitJob("high", specs("high", 1), JobPolicy(priority=5)), 1.0)
    assert lease_ids(book.handle(RequestTask("w", 2), 2.0)) == ["high-0", "low-0"]


def test_gpu_task_only_goes_to_a_worker_with_a_free_gpu() -> None:
    """A CPU-only worker never gets a GPU task; a GPU worker gets one per free GPU."""
    book = make_book(("cpu", "n1", CPU, 4), ("gpu", "n2", GPU, 4))
    tasks = [
        TaskSpec("g1", "k", 1, needs=Resources(1, 1)),
        TaskSpec("g2", "k", 2, needs=Resources(1, 1)),
        TaskSpec("c", "k", 3),
    ]
    book.handle(SubmitJob("j", tasks, NO_SPEC), 0.0)
    assert lease_ids(book.handle(RequestTask("cpu", 4), 1.0)) == ["c"]
    assert lease_ids(book.handle(RequestTask("gpu", 4), 1.0)) == ["g1"]  # one GPU, held
    assert book.statistics().tasks[TaskState.PENDING] == 1


def test_locality_is_preferred_over_fifo() -> None:
    """A worker first gets the tasks whose context is on its node, even if they are newer."""
    book = make_book(("w1", "n1", CPU, 1), ("w2", "n2", CPU, 1))
    tasks = [TaskSpec("far", "k", 0, locality="n2"), TaskSpec("near", "k", 1, locality="n1")]
    book.handle(SubmitJob("j", tasks, NO_SPEC), 0.0)
    assert lease_ids(book.handle(RequestTask("w1", 1), 1.0)) == ["near"]
    assert lease_ids(book.handle(RequestTask("w2", 1), 1.0)) == ["far"]


def test_locality_hint_never_starves_a_task() -> None:
    """A task goes elsewhere when its node is unknown or full, but waits for a node with room."""
    book = make_book(("w1", "n1", CPU, 2), ("w2", "n2", CPU, 1))
    tasks = [
        TaskSpec("ghost", "k", 0, locality="nowhere"),
        TaskSpec("n2a", "k", 1, locality="n2"),
        TaskSpec("n2b", "k", 2, locality="n2"),
    ]
    book.handle(SubmitJob("j", tasks, NO_SPEC), 0.0)
    # n2 has a free slot: its tasks wait for it, the task of an unknown node does not
    assert lease_ids(book.handle(RequestTask("w1", 2), 1.0)) == ["ghost"]
    assert lease_ids(book.handle(RequestTask("w2", 1), 1.0)) == ["n2a"]
    # n2 is full now, so n1 may take its other task
    assert lease_ids(book.handle(RequestTask("w1", 1), 1.0)) == ["n2b"]


def test_task_of_a_draining_node_goes_elsewhere() -> None:
    """A task whose preferred node is draining is leased to another node."""
    book = make_book(("w1", "n1", CPU, 1), ("w2", "n2", CPU, 1))
    book.handle(SubmitJob("j", [TaskSpec("t", "k", 0, locality="n2")], NO_SPEC), 0.0)
    assert book.handle(RequestTask("w1", 1), 1.0) == []
    assert only(book.handle(DrainNode("n2"), 1.0), NodeDrained) == [NodeDrained("n2")]
    assert lease_ids(book.handle(RequestTask("w1", 1), 1.0)) == ["t"]


def test_free_slots_are_capped_by_the_slots_the_book_sees() -> None:
    """A worker asking for more than its free slots gets only what its slots allow."""
    book = make_book(("w", "n", CPU, 2))
    book.handle(SubmitJob("j", specs("t", 5), NO_SPEC), 0.0)
    assert len(lease_ids(book.handle(RequestTask("w", 10), 1.0))) == 2
    assert lease_ids(book.handle(RequestTask("w", 10), 1.0)) == []
    load = book.worker_load("w")
    assert (load.used, load.slots, load.load) == (2, 2, 1.0)


# ------------------------------------------------------------------ leases


def test_every_lease_is_recorded_and_counted() -> None:
    """A lease comes with a Record of the task as LEASED and a deadline of now + lease_s."""
    book = make_book(("w", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 1), JobPolicy(lease_s=10)), 0.0)
    records, others = split_commands(book.handle(RequestTask("w", 1), 5.0))
    (lease,) = others
    assert isinstance(lease, Lease) and lease.deadline == 15.0 and lease.attempt == 1
    assert isinstance(records[0].entry, TaskRecord)
    assert records[0].entry.state is TaskState.LEASED
    assert records[0].entry.last_lease_id == lease.lease_id


def test_expired_lease_requeues_the_task_and_counts_an_attempt() -> None:
    """A lease not renewed by its deadline is cancelled and its task is pending again."""
    book = make_book(("w", "n", CPU, 1), ("v", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 1), JobPolicy(lease_s=10)), 0.0)
    (lease,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    assert book.handle(SchedulerTick(), 9.9) == []
    out = book.handle(SchedulerTick(), 10.0)
    assert only(out, CancelLease) == [CancelLease("w", "t-0", lease.lease_id, "lease expired")]
    assert book.task("t-0").state is TaskState.PENDING and book.task("t-0").attempts == 1
    (again,) = only(book.handle(RequestTask("v", 1), 10.0), Lease)
    assert again.attempt == 2 and again.lease_id != lease.lease_id


def test_renew_extends_the_lease_and_a_stale_lease_is_refused() -> None:
    """Renew moves the deadline to now + lease_s; a Renew of an ended lease is rejected."""
    book = make_book(("w", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 1), JobPolicy(lease_s=10)), 0.0)
    (lease,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    (ack,) = book.handle(Renew("w", "t-0", lease.lease_id), 8.0)
    assert ack == Ack("w", "t-0", lease.lease_id, AckOutcome.RENEWED, 18.0)
    assert book.handle(SchedulerTick(), 12.0) == []
    assert only(book.handle(SchedulerTick(), 18.0), CancelLease)
    (reject,) = book.handle(Renew("w", "t-0", lease.lease_id), 19.0)
    assert isinstance(reject, Reject) and "no longer valid" in reject.reason


def test_renew_from_another_worker_is_refused() -> None:
    """A worker cannot renew a lease that belongs to another worker."""
    book = make_book(("w", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 1)), 0.0)
    (lease,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    (reject,) = book.handle(Renew("intruder", "t-0", lease.lease_id), 1.0)
    assert isinstance(reject, Reject) and "belongs to worker 'w'" in reject.reason


def test_worker_death_requeues_its_tasks_at_once() -> None:
    """When a worker leaves, its leased tasks are pending in the same step, attempt counted."""
    book = make_book(("w", "n1", CPU, 2), ("v", "n2", CPU, 2))
    book.handle(SubmitJob("j", specs("t", 2), NO_SPEC), 0.0)
    book.handle(RequestTask("w", 2), 0.0)
    out = book.handle(WorkerLeft("w", "killed"), 1.0)
    rows = [r.entry for r in only(out, Record)]
    assert [(r.task_id, r.state) for r in rows if isinstance(r, TaskRecord)] == [
        ("t-0", TaskState.PENDING),
        ("t-1", TaskState.PENDING),
    ]
    assert book.task("t-0").attempts == 1 and "killed" in (book.task("t-0").error or "")
    assert lease_ids(book.handle(RequestTask("v", 2), 1.0)) == ["t-0", "t-1"]


def test_node_dead_removes_all_its_workers() -> None:
    """NodeDead makes every worker of the node leave and requeues their tasks."""
    book = make_book(("a", "n1", CPU, 1), ("b", "n1", CPU, 1), ("c", "n2", CPU, 2))
    book.handle(SubmitJob("j", specs("t", 2), NO_SPEC), 0.0)
    book.handle(RequestTask("a", 1), 0.0)
    book.handle(RequestTask("b", 1), 0.0)
    book.handle(NodeDead("n1"), 1.0)
    stats = book.statistics()
    assert set(stats.workers) == {"c"} and stats.tasks[TaskState.PENDING] == 2
    assert isinstance(book.handle(RequestTask("a", 1), 1.0)[0], Reject)


# ------------------------------------------------------------------ failures


def test_failures_back_off_exponentially_then_dead_letter() -> None:
    """Fail waits base * 2**(n-1) before a retry; the max_attempts-th failure dead-letters."""
    policy = JobPolicy(
        max_attempts=3, backoff_base_s=1.0, backoff_max_s=100.0, speculation=Speculation(enabled=False)
    )
    book = make_book(("w", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 1), policy), 0.0)
    (lease,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    assert only(fail(book, lease, 10.0, "e1"), Ack)[0].outcome is AckOutcome.RECORDED
    info = book.task("t-0")
    assert (info.state, info.not_before) == (TaskState.FAILED, 11.0)
    assert book.handle(RequestTask("w", 1), 10.9) == []
    (lease,) = only(book.handle(RequestTask("w", 1), 11.0), Lease)
    assert lease.attempt == 2
    fail(book, lease, 20.0, "e2")
    assert book.task("t-0").not_before == 22.0  # 1 * 2**1
    assert only(book.handle(SchedulerTick(), 22.0), Record)  # SchedulerTick ends the backoff too
    (lease,) = only(book.handle(RequestTask("w", 1), 22.0), Lease)
    out = fail(book, lease, 30.0, "e3")
    assert book.task("t-0").state is TaskState.DEAD
    assert only(out, JobFinished) == [JobFinished("j", JobState.FAILED)]
    (dead,) = book.dead_letters("j")
    assert (dead.task_id, dead.attempts, dead.error, dead.traceback) == ("t-0", 3, "e3", "tb:e3")


def test_backoff_is_capped() -> None:
    """The wait after a failure never exceeds backoff_max_s."""
    policy = JobPolicy(max_attempts=5, backoff_base_s=10.0, backoff_max_s=15.0)
    assert [policy.backoff(n) for n in (1, 2, 3)] == [10.0, 15.0, 15.0]


def test_invalid_policies_raise_config_error() -> None:
    """Nonsense policy values are refused when the policy is built."""
    with pytest.raises(ConfigError, match="max_attempts"):
        JobPolicy(max_attempts=0)
    with pytest.raises(ConfigError, match="factor"):
        Speculation(factor=0.5)


def test_lease_expiry_can_dead_letter_a_hanging_task() -> None:
    """A task whose every lease expires ends dead-lettered with the expiry as its error."""
    book = make_book(("w", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 1), JobPolicy(max_attempts=2, lease_s=5)), 0.0)
    for now in (0.0, 5.0):
        book.handle(RequestTask("w", 1), now)
        book.handle(SchedulerTick(), now + 5.0)
    (dead,) = book.dead_letters("j")
    assert dead.attempts == 2 and "expired" in dead.error


# ------------------------------------------------------------------ completion


def test_complete_commits_and_a_second_complete_is_a_duplicate() -> None:
    """The first Complete makes the task done; another one is acked as a duplicate."""
    book = make_book(("w", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 1)), 0.0)
    (lease,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    out = complete(book, lease, 1.0)
    assert only(out, Ack)[0].outcome is AckOutcome.COMMITTED
    assert only(out, JobFinished) == [JobFinished("j", JobState.DONE)]
    assert book.task("t-0").result_ref == "ref"
    assert complete(book, lease, 2.0) == [Ack("w", "t-0", lease.lease_id, AckOutcome.DUPLICATE)]
    assert fail(book, lease, 2.0) == [Ack("w", "t-0", lease.lease_id, AckOutcome.DUPLICATE)]


def test_late_complete_from_an_expired_lease_is_accepted() -> None:
    """A Complete for an expired lease commits the task if it is not done; the new copy stops."""
    book = make_book(("w", "n", CPU, 1), ("v", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 1), JobPolicy(lease_s=5)), 0.0)
    (old,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    book.handle(SchedulerTick(), 5.0)
    (new,) = only(book.handle(RequestTask("v", 1), 5.0), Lease)
    out = complete(book, old, 6.0)
    assert only(out, Ack)[0].outcome is AckOutcome.COMMITTED
    assert [c.lease_id for c in only(out, CancelLease)] == [new.lease_id]
    assert book.task("t-0").state is TaskState.DONE


def test_late_fail_from_an_ended_lease_changes_nothing() -> None:
    """A Fail for a lease that already expired is ignored: its attempt was already counted."""
    book = make_book(("w", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 1), JobPolicy(lease_s=5)), 0.0)
    (old,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    book.handle(SchedulerTick(), 5.0)
    assert fail(book, old, 6.0) == [Ack("w", "t-0", old.lease_id, AckOutcome.IGNORED)]
    assert book.task("t-0").attempts == 1


def test_reports_for_unknown_tasks_or_leases_are_rejected() -> None:
    """A Complete naming an unknown task, or a lease never issued for it, is rejected."""
    book = make_book(("w", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 1)), 0.0)
    assert isinstance(book.handle(Complete("w", "nope", 1, "r"), 1.0)[0], Reject)
    (reject,) = book.handle(Complete("w", "t-0", 99, "r"), 1.0)
    assert isinstance(reject, Reject) and "never issued" in reject.reason


# ------------------------------------------------------------------ jobs and nodes


def test_cancel_job_cancels_pending_and_stops_leased_tasks() -> None:
    """CancelJob cancels pending tasks, sends CancelLease for running ones, and ends the job."""
    book = make_book(("w", "n", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 3)), 0.0)
    (lease,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    out = book.handle(CancelJob("j"), 1.0)
    assert only(out, CancelLease) == [CancelLease("w", "t-0", lease.lease_id, "job cancelled")]
    assert only(out, JobFinished) == [JobFinished("j", JobState.CANCELLED)]
    assert book.statistics().tasks[TaskState.CANCELLED] == 3
    assert book.worker_load("w").used == 0
    assert complete(book, lease, 2.0)[0] == Ack("w", "t-0", lease.lease_id, AckOutcome.IGNORED)
    assert isinstance(book.handle(CancelJob("j"), 2.0)[0], Reject)
    assert book.handle(RequestTask("w", 1), 2.0) == []


def test_drain_node_stops_new_work_and_reports_once_idle() -> None:
    """A draining node's workers get no new task; NodeDrained comes when its last lease ends."""
    book = make_book(("w", "n", CPU, 2))
    book.handle(SubmitJob("j", specs("t", 3)), 0.0)
    (lease,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    assert book.handle(DrainNode("n"), 1.0) == []
    assert book.handle(RequestTask("w", 2), 1.0) == []
    assert book.worker_load("w").draining
    out = complete(book, lease, 2.0)
    assert only(out, NodeDrained) == [NodeDrained("n")]
    assert not only(book.handle(SchedulerTick(), 3.0), NodeDrained)  # reported once


def test_submit_is_rejected_for_taken_ids_and_empty_jobs() -> None:
    """A job id or task id already used, or a job without tasks, is rejected unchanged."""
    book = TaskBook()
    book.handle(SubmitJob("j", specs("t", 1)), 0.0)
    for event in (
        SubmitJob("j", specs("u", 1)),
        SubmitJob("k", specs("t", 1)),
        SubmitJob("k", []),
        SubmitJob("k", [specs("u", 1)[0]] * 2),
    ):
        (reject,) = book.handle(event, 1.0)
        assert isinstance(reject, Reject)
    assert [j.job_id for j in book.jobs()] == ["j"]


def test_read_outs_of_unknown_ids_raise_task_error() -> None:
    """Asking about a job, task or worker the book does not know raises TaskError."""
    book = TaskBook()
    for call in (lambda: book.dead_letters("x"), lambda: book.task("x"), lambda: book.worker_load("x")):
        with pytest.raises(TaskError):
            call()


# ------------------------------------------------------------------ speculation


def tail_book(max_copies: int = 1) -> tuple[TaskBook, Lease]:
    """Three tasks done in 10 s each, one straggler t-3 running on w2 since t=0."""
    policy = JobPolicy(speculation=Speculation(factor=1.5, min_runtime_s=5, max_copies=max_copies))
    book = make_book(("w1", "n1", CPU, 3), ("w2", "n2", CPU, 1), ("w3", "n3", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 4), policy), 0.0)
    for lease in only(book.handle(RequestTask("w1", 3), 0.0), Lease):
        complete(book, lease, 10.0)
    (straggler,) = only(book.handle(RequestTask("w2", 1), 0.0), Lease)
    return book, straggler


def test_backup_copy_starts_only_past_factor_times_median() -> None:
    """An idle worker gets a backup of the straggler once it ran over 1.5 x the median (10 s)."""
    book, straggler = tail_book()
    assert book.handle(RequestTask("w1", 1), 15.0) == []  # 15 s is not longer than 15 s
    (backup,) = only(book.handle(RequestTask("w1", 1), 15.5), Lease)
    assert (backup.task_id, backup.backup, backup.attempt) == (straggler.task_id, True, 1)
    assert backup.lease_id != straggler.lease_id
    assert book.statistics().speculative_launched == 1


def test_backups_are_bounded_by_max_copies_and_one_per_worker() -> None:
    """No task gets more than max_copies backups, and a worker never runs two copies of one."""
    book, straggler = tail_book(max_copies=1)
    assert book.handle(RequestTask("w2", 1), 20.0) == []  # w2 runs the first copy
    assert len(only(book.handle(RequestTask("w1", 1), 20.0), Lease)) == 1
    assert book.handle(RequestTask("w3", 1), 20.0) == []  # max_copies reached
    assert book.task(straggler.task_id).copies == 2


def test_no_backup_before_the_tail() -> None:
    """While a job still has pending tasks, its slow tasks get no backup."""
    policy = JobPolicy(speculation=Speculation(factor=1.0, min_runtime_s=1))
    book = make_book(("w", "n", CPU, 2), ("idle", "n2", CPU, 1))
    tasks = [*specs("t", 3), TaskSpec("gpu", "k", 9, needs=Resources(1, 1))]
    book.handle(SubmitJob("j", tasks, policy), 0.0)
    leases = only(book.handle(RequestTask("w", 2), 0.0), Lease)
    complete(book, leases[0], 1.0)
    assert lease_ids(book.handle(RequestTask("w", 1), 1.0)) == ["t-2"]
    # "gpu" is pending (no GPU anywhere), so t-1 and t-2 are not the tail yet
    assert book.handle(RequestTask("idle", 1), 100.0) == []
    book.handle(WorkerJoined("g", "n3", GPU, 1), 100.0)
    assert lease_ids(book.handle(RequestTask("g", 1), 100.0)) == ["gpu"]
    (backup,) = only(book.handle(RequestTask("idle", 1), 100.0), Lease)
    assert (backup.task_id, backup.backup) == ("t-1", True)  # the slowest: running since 0


def test_speculation_can_be_turned_off() -> None:
    """With speculation disabled no backup is ever launched."""
    book = make_book(("w1", "n1", CPU, 2), ("w2", "n2", CPU, 1))
    book.handle(SubmitJob("j", specs("t", 2), NO_SPEC), 0.0)
    leases = only(book.handle(RequestTask("w1", 2), 0.0), Lease)
    complete(book, leases[0], 1.0)
    assert book.handle(RequestTask("w2", 1), 1000.0) == []


def test_first_completion_wins_and_other_copies_are_cancelled() -> None:
    """The backup finishing first commits the task and the first copy gets a CancelLease."""
    book, straggler = tail_book()
    (backup,) = only(book.handle(RequestTask("w1", 1), 16.0), Lease)
    out = complete(book, backup, 20.0)
    assert only(out, CancelLease) == [
        CancelLease("w2", straggler.task_id, straggler.lease_id, "another copy of the task finished first")
    ]
    assert only(out, JobFinished) == [JobFinished("j", JobState.DONE)]
    stats = book.statistics()
    assert (stats.speculative_won, stats.leases_outstanding) == (1, 0)
    assert complete(book, straggler, 21.0) == [
        Ack("w2", straggler.task_id, straggler.lease_id, AckOutcome.DUPLICATE)
    ]


def test_fail_of_one_copy_is_not_an_attempt_while_another_runs() -> None:
    """A copy failing while another copy runs costs no attempt; the last copy failing does."""
    book, straggler = tail_book()
    (backup,) = only(book.handle(RequestTask("w1", 1), 16.0), Lease)
    fail(book, straggler, 17.0)
    info = book.task(straggler.task_id)
    assert (info.state, info.attempts, info.copies) == (TaskState.LEASED, 0, 1)
    fail(book, backup, 18.0)
    info = book.task(straggler.task_id)
    assert (info.state, info.attempts, info.copies) == (TaskState.FAILED, 1, 0)


# ------------------------------------------------------------------ randomized invariants


class Model:
    """What a driver learns from the commands: live leases, commits, journaled rows."""

    def __init__(self) -> None:
        self.leases: dict[int, Lease] = {}
        self.workers: dict[str, tuple[str, Resources]] = {}
        self.draining: set[str] = set()
        self.commits: Counter[str] = Counter()
        self.jobs: dict[str, JobRecord] = {}
        self.rows: dict[str, tuple[TaskSpec, TaskRecord]] = {}
        self.issued: list[Lease] = []

    def apply(self, event: Event, out: Sequence[Command]) -> None:
        rejected = any(isinstance(c, Reject) for c in out)
        if isinstance(event, WorkerJoined) and not rejected:
            self.drop_worker(event.worker_id)
            self.workers[event.worker_id] = (event.node_id, event.resources)
        elif isinstance(event, WorkerLeft) and not rejected:
            self.drop_worker(event.worker_id)
            del self.workers[event.worker_id]
        elif isinstance(event, NodeDead):
            for worker_id in [w for w, (n, _) in self.workers.items() if n == event.node_id]:
                self.drop_worker(worker_id)
                del self.workers[worker_id]
            self.draining.discard(event.node_id)
        elif isinstance(event, DrainNode):
            self.draining.add(event.node_id)
        for c in out:
            if isinstance(c, Lease):
                node, resources = self.workers[c.worker_id]
                assert node not in self.draining, "a draining node got a task"
                assert self.commits[c.task_id] == 0, "a done task was leased again"
                spec = self.rows[c.task_id][0]
                assert spec.needs.gpu <= resources.gpu, "a GPU task went to a worker without"
                self.leases[c.lease_id] = c
                self.issued.append(c)
            elif isinstance(c, CancelLease):
                del self.leases[c.lease_id]
            elif isinstance(c, Ack) and c.outcome in (AckOutcome.COMMITTED, AckOutcome.RECORDED):
                self.leases.pop(c.lease_id, None)
                if c.outcome is AckOutcome.COMMITTED:
                    self.commits[c.task_id] += 1
                    assert self.commits[c.task_id] == 1, "a task was committed twice"
            elif isinstance(c, Record):
                self.journal(c.entry)

    def journal(self, entry: JobSubmitted | JobRecord | TaskRecord) -> None:
        if isinstance(entry, JobSubmitted):
            self.jobs[entry.job.job_id] = entry.job
            for spec in entry.tasks:
                row = TaskRecord(
                    spec.task_id, entry.job.job_id, TaskState.PENDING, 0, 0.0, 0, None, None, None
                )
                self.rows[spec.task_id] = (spec, row)
        elif isinstance(entry, JobRecord):
            self.jobs[entry.job_id] = entry
        else:
            self.rows[entry.task_id] = (self.rows[entry.task_id][0], entry)

    def drop_worker(self, worker_id: str) -> None:
        for lease_id in [i for i, c in self.leases.items() if c.worker_id == worker_id]:
            del self.leases[lease_id]


def check_invariants(book: TaskBook, model: Model, total: int) -> None:
    stats = book.statistics()
    assert sum(stats.tasks.values()) == total
    for job_id, counts in stats.jobs.items():
        assert all(n >= 0 for n in counts.values()), job_id
    assert {s: sum(c[s] for c in stats.jobs.values()) for s in TaskState} == dict(stats.tasks)
    assert stats.leases_outstanding == len(model.leases)
    assert sum(w.used for w in stats.workers.values()) == len(model.leases)
    assert all(w.used <= w.slots for w in stats.workers.values())
    assert stats.tasks[TaskState.DONE] == sum(model.commits.values())


def check_restore_matches(book: TaskBook, model: Model) -> None:
    """The journaled rows alone rebuild every task's state and attempt count (a leased task is
    held over under its last lease, a backing-off one backs off on)."""
    restored = TaskBook.restore(model.jobs.values(), list(model.rows.values()))
    for task_id in model.rows:
        live, back = book.task(task_id), restored.task(task_id)
        assert (back.state, back.attempts) == (live.state, live.attempts), task_id
        assert back.copies == (live.state is TaskState.LEASED), task_id
    assert [j.state for j in restored.jobs()] == [j.state for j in book.jobs()]


@pytest.mark.parametrize("seed", [2, 3, 5, 8, 10])  # seeds that also cancel and speculate
def test_random_events_keep_the_invariants_and_every_task_ends(seed: int) -> None:
    """Thousands of random events never commit a task twice, keep counts consistent, and end."""
    rng = random.Random(seed)
    book, model = TaskBook(), Model()
    now = 0.0

    def send(event: Event) -> list[Command]:
        out = book.handle(event, now)
        model.apply(event, out)
        return out

    nodes = [f"n{i}" for i in range(4)]
    total = 0
    for j in range(4):
        policy = JobPolicy(
            max_attempts=rng.randint(1, 4),
            lease_s=rng.uniform(3, 15),
            backoff_base_s=rng.choice([0.0, 0.5, 2.0]),
            backoff_max_s=5.0,
            priority=rng.randint(0, 1),
            speculation=Speculation(
                enabled=rng.random() < 0.7, factor=1.2, min_runtime_s=1, max_copies=rng.randint(0, 2)
            ),
        )
        tasks = [
            TaskSpec(
                f"j{j}-{i}",
                "k",
                i,
                needs=Resources(rng.choice([0.5, 1, 2]), 1 if rng.random() < 0.2 else 0),
                locality=rng.choice([None, None, "n0", "n1", "gone"]),
            )
            for i in range(rng.randint(60, 150))
        ]
        send(SubmitJob(f"job{j}", tasks, policy))
        total += len(tasks)

    actions = ["join", "leave", "node_dead", "drain", "request", "report", "stale", "renew", "cancel", "tick"]
    weights = [8, 3, 0.3, 0.1, 28, 25, 7, 8, 0.02, 20]
    for step in range(2000):
        action = rng.choices(actions, weights)[0]
        if action == "join":
            gpus = rng.choice([0, 0, 1, 2])
            send(
                WorkerJoined(
                    f"w{rng.randint(0, 7)}",
                    rng.choice(nodes),
                    Resources(rng.choice([2, 4]), gpus),
                    rng.randint(1, 3),
                )
            )
        elif action == "leave" and model.workers:
            send(WorkerLeft(rng.choice(sorted(model.workers)), "killed"))
        elif action == "node_dead":
            send(NodeDead(rng.choice(nodes)))
        elif action == "drain":
            send(DrainNode(rng.choice(nodes)))
        elif action == "request" and model.workers:
            send(RequestTask(rng.choice(sorted(model.workers)), rng.randint(1, 3)))
        elif action == "report" and model.leases:
            lease = model.leases[rng.choice(sorted(model.leases))]
            if rng.random() < 0.7:
                send(Complete(lease.worker_id, lease.task_id, lease.lease_id, "r"))
            else:
                send(Fail(lease.worker_id, lease.task_id, lease.lease_id, "err", "tb"))
        elif action == "stale" and model.issued:  # late, duplicate or stale reports
            lease = rng.choice(model.issued)
            kind = rng.randint(0, 2)
            if kind == 0:
                send(Renew(lease.worker_id, lease.task_id, lease.lease_id))
            elif kind == 1:
                send(Complete(lease.worker_id, lease.task_id, lease.lease_id, "late"))
            else:
                send(Fail(lease.worker_id, lease.task_id, lease.lease_id, "late", ""))
        elif action == "renew" and model.leases:
            lease = model.leases[rng.choice(sorted(model.leases))]
            send(Renew(lease.worker_id, lease.task_id, lease.lease_id))
        elif action == "cancel":
            send(CancelJob(f"job{rng.randint(0, 3)}"))
        else:
            now += rng.uniform(0, 1)
            send(SchedulerTick())
        check_invariants(book, model, total)
        if step % 500 == 0:
            check_restore_matches(book, model)

    # wind down: only two fresh workers on a fresh node remain; run everything to its end
    for worker_id in sorted(model.workers):
        send(WorkerLeft(worker_id, "wind down"))
    send(WorkerJoined("final-a", "fresh", Resources(64, 8), 16))
    send(WorkerJoined("final-b", "fresh", Resources(64, 8), 16))
    for _ in range(3000):
        if all(j.state is not JobState.RUNNING for j in book.jobs()):
            break
        now += 1.0
        send(SchedulerTick())
        send(RequestTask(rng.choice(["final-a", "final-b"]), rng.randint(1, 16)))
        for lease in sorted(model.leases.values(), key=lambda c: c.lease_id):
            if lease.lease_id not in model.leases:
                continue  # cancelled by an earlier report of this round
            roll = rng.random()
            if roll < 0.3:
                send(Complete(lease.worker_id, lease.task_id, lease.lease_id, "r"))
            elif roll < 0.4:
                send(Fail(lease.worker_id, lease.task_id, lease.lease_id, "err", "tb"))
            elif roll < 0.9:
                send(Renew(lease.worker_id, lease.task_id, lease.lease_id))
        check_invariants(book, model, total)
    stats = book.statistics()
    assert all(j.state is not JobState.RUNNING for j in book.jobs())
    assert stats.tasks[TaskState.PENDING] == stats.tasks[TaskState.LEASED] == 0
    assert stats.tasks[TaskState.FAILED] == 0 and stats.leases_outstanding == 0
    for job in book.jobs():
        dead = {d.task_id for d in book.dead_letters(job.job_id)}
        assert len(dead) == job.counts[TaskState.DEAD]
        assert all(book.dead_letters(job.job_id)[i].error for i in range(len(dead)))
    check_restore_matches(book, model)
