"""The task book: leases by task kind, what a stuck task waits for, and a committed output as the truth."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.jobspec import parse_job
from troupe.runtime.tasks.state import (
    Ack,
    AckOutcome,
    CancelLease,
    Command,
    Complete,
    Decline,
    DrainNode,
    JobFinished,
    JobPolicy,
    JobRecord,
    JobState,
    Lease,
    NodeDead,
    Record,
    RequestTask,
    Resources,
    SchedulerTick,
    Speculation,
    SubmitJob,
    TaskRecord,
    TaskSpec,
    TaskState,
    UndrainNode,
    WorkerJoined,
)

C = TypeVar("C")
NO_SPEC = JobPolicy(speculation=Speculation(enabled=False))
CPU = Resources(cpu=8, gpu=0)


def only(commands: Iterable[Command], kind: type[C]) -> list[C]:
    return [c for c in commands if isinstance(c, kind)]


def join(
    book: TaskBook, worker_id: str, node: str, *kinds: str, resources: Resources = CPU, slots: int = 4
) -> None:
    assert book.handle(WorkerJoined(worker_id, node, resources, slots, frozenset(kinds)), 0.0) == []


def mixed(n: int) -> list[TaskSpec]:
    """``n`` tasks alternating between kinds "plan" and "render"."""
    return [TaskSpec(f"t-{i}", ("plan", "render")[i % 2], i) for i in range(n)]


def waiting(book: TaskBook, job_id: str) -> list[tuple[str, int, str]]:
    job = next(j for j in book.jobs() if j.job_id == job_id)
    return [(w.kind, w.tasks, w.reason) for w in job.waiting]


def test_a_worker_is_leased_only_the_kinds_it_runs() -> None:
    """Two workers with different kinds split a job of both kinds by kind; none is wasted."""
    book = TaskBook()
    join(book, "planner", "n1", "plan")
    join(book, "renderer", "n2", "render")
    book.handle(SubmitJob("j", mixed(8), NO_SPEC), 0.0)
    got = {w: only(book.handle(RequestTask(w, 4), 1.0), Lease) for w in ("planner", "renderer")}
    assert sorted(lease.kind for lease in got["planner"]) == ["plan"] * 4
    assert sorted(lease.kind for lease in got["renderer"]) == ["render"] * 4
    for lease in got["planner"] + got["renderer"]:
        book.handle(Complete(lease.worker_id, lease.task_id, lease.lease_id, "ref"), 2.0)
    assert all(book.task(f"t-{i}").attempts == 0 for i in range(8))  # attempts count losses only
    assert next(iter(book.jobs())).state is JobState.DONE


def test_a_worker_with_no_kinds_runs_every_kind() -> None:
    """An empty kind list (an actor that names none) takes tasks of any kind."""
    book = TaskBook()
    join(book, "any", "n1")
    book.handle(SubmitJob("j", mixed(4), NO_SPEC), 0.0)
    assert len(only(book.handle(RequestTask("any", 4), 1.0), Lease)) == 4


def test_a_kind_nobody_runs_waits_and_says_so_until_a_worker_of_that_kind_joins() -> None:
    """Tasks of a kind no worker runs stay pending with the reason, cost no attempt, and run once one
    joins."""
    book = TaskBook()
    join(book, "planner", "n1", "plan")
    book.handle(SubmitJob("j", mixed(4), NO_SPEC), 0.0)
    plans = only(book.handle(RequestTask("planner", 4), 1.0), Lease)
    assert [lease.kind for lease in plans] == ["plan", "plan"]
    assert waiting(book, "j") == [("render", 2, "waiting for kind render: no live worker runs it")]
    book.handle(SchedulerTick(), 1000.0)  # time passing changes nothing for them
    assert [book.task(t).state for t in ("t-1", "t-3")] == [TaskState.PENDING] * 2
    join(book, "renderer", "n2", "render")
    assert waiting(book, "j") == []
    renders = only(book.handle(RequestTask("renderer", 4), 1001.0), Lease)
    assert sorted(lease.task_id for lease in renders) == ["t-1", "t-3"]
    assert all(lease.attempt == 1 for lease in renders)


def test_the_kind_is_waited_for_again_when_its_last_worker_dies() -> None:
    """When the only node running a kind dies, the job shows its tasks waiting for that kind."""
    book = TaskBook()
    join(book, "renderer", "n2", "render")
    book.handle(SubmitJob("j", [TaskSpec("r", "render", 0)], NO_SPEC), 0.0)
    book.handle(NodeDead("n2"), 1.0)
    assert waiting(book, "j") == [("render", 1, "waiting for kind render: no live worker runs it")]


def test_a_kind_whose_every_worker_is_draining_says_so_until_an_undrain() -> None:
    """A node drained for an upgrade, a job submitted meanwhile: its tasks sat pending with no
    reason in `ctl jobs`, as if a worker could take them."""
    book = TaskBook()
    join(book, "renderer", "n2", "render")
    join(book, "planner", "n1", "plan")
    book.handle(DrainNode("n2"), 0.0)
    book.handle(SubmitJob("j", [TaskSpec("r", "render", 0)], NO_SPEC), 0.0)
    assert waiting(book, "j") == [
        (
            "render",
            1,
            "waiting for kind render: every worker that runs it is draining (node n2; "
            "`troupe ctl undrain NODE` resumes one)",
        )
    ]
    book.handle(UndrainNode("n2"), 1.0)
    assert waiting(book, "j") == []


def test_a_task_needing_a_gpu_no_worker_has_says_what_it_waits_for() -> None:
    """gpu = 1 on a CPU-only cluster: pending, with "waiting for gpu=1: no worker has it"."""
    book = TaskBook()
    join(book, "cpu", "n1", "render")
    book.handle(
        SubmitJob(
            "j", [TaskSpec("g", "render", 0, needs=Resources(1, 1)), TaskSpec("c", "render", 1)], NO_SPEC
        ),
        0.0,
    )
    assert [lease.task_id for lease in only(book.handle(RequestTask("cpu", 4), 1.0), Lease)] == ["c"]
    assert waiting(book, "j") == [("render", 1, "waiting for gpu=1: no worker has it")]
    join(book, "gpu-other-kind", "n2", "plan", resources=Resources(8, 1))
    assert waiting(book, "j") == [("render", 1, "waiting for gpu=1: no worker that runs kind render has it")]
    join(book, "gpu", "n3", "render", resources=Resources(8, 1))
    assert waiting(book, "j") == []
    assert [lease.task_id for lease in only(book.handle(RequestTask("gpu", 4), 2.0), Lease)] == ["g"]


def test_a_declined_copy_goes_back_without_an_attempt_and_the_worker_gets_no_more_of_that_kind() -> None:
    """A worker that declines a kind (it advertised it wrongly) costs no attempt and is not asked again."""
    book = TaskBook()
    join(book, "liar", "n1", "plan", "render")
    book.handle(
        SubmitJob("j", [TaskSpec("r", "render", 0), TaskSpec("p", "plan", 1)], JobPolicy(max_attempts=1)), 0.0
    )
    leases = {c.kind: c for c in only(book.handle(RequestTask("liar", 1), 1.0), Lease)}
    lease = leases["render"]
    out = book.handle(Decline("liar", "r", lease.lease_id, "no actor runs render"), 2.0)
    assert only(out, Ack) == [Ack("liar", "r", lease.lease_id, AckOutcome.RETURNED)]
    info = book.task("r")
    assert (info.state, info.attempts) == (TaskState.PENDING, 0)
    assert [c.kind for c in only(book.handle(RequestTask("liar", 4), 3.0), Lease)] == ["plan"]
    assert waiting(book, "j") == [("render", 1, "waiting for kind render: no live worker runs it")]
    stale = book.handle(Decline("liar", "r", lease.lease_id, "again"), 4.0)
    assert only(stale, Ack)[0].outcome is AckOutcome.IGNORED


def test_a_late_complete_overturns_a_dead_letter_and_the_job_ends_done() -> None:
    """max_attempts = 1, the lease expires (a partition): dead, job failed; the late Complete makes both
    done."""
    book = TaskBook()
    join(book, "w", "n1")
    book.handle(
        SubmitJob(
            "j",
            [TaskSpec("a", "k", 0), TaskSpec("b", "k", 1)],
            JobPolicy(max_attempts=1, lease_s=5, speculation=Speculation(False)),
        ),
        0.0,
    )
    leases = {c.task_id: c for c in only(book.handle(RequestTask("w", 2), 0.0), Lease)}
    book.handle(Complete("w", "b", leases["b"].lease_id, "out://b"), 1.0)
    expired = book.handle(SchedulerTick(), 6.0)
    assert only(expired, JobFinished) == [JobFinished("j", JobState.FAILED)]
    assert book.task("a").state is TaskState.DEAD
    out = book.handle(Complete("w", "a", leases["a"].lease_id, "out://a"), 7.0)
    assert only(out, Ack) == [Ack("w", "a", leases["a"].lease_id, AckOutcome.COMMITTED)]
    assert only(out, JobFinished) == [JobFinished("j", JobState.DONE)]
    records = [r.entry for r in only(out, Record)]
    assert any(isinstance(e, TaskRecord) and e.state is TaskState.DONE for e in records)
    assert any(isinstance(e, JobRecord) and e.state is JobState.DONE for e in records)
    info = book.task("a")
    assert (info.state, info.result_ref) == (TaskState.DONE, "out://a")
    assert book.dead_letters("j") == []
    assert next(iter(book.jobs())).state is JobState.DONE
    again = book.handle(Complete("w", "a", leases["a"].lease_id, "out://a"), 8.0)
    assert only(again, Ack)[0].outcome is AckOutcome.DUPLICATE


def test_a_job_with_another_real_failure_stays_failed_after_one_overturn() -> None:
    """Only a job whose every failure was overturned ends done."""
    book = TaskBook()
    join(book, "w", "n1")
    book.handle(
        SubmitJob("j", [TaskSpec("a", "k", 0), TaskSpec("b", "k", 1)], JobPolicy(max_attempts=1, lease_s=5)),
        0.0,
    )
    leases = {c.task_id: c for c in only(book.handle(RequestTask("w", 2), 0.0), Lease)}
    book.handle(SchedulerTick(), 6.0)
    out = book.handle(Complete("w", "a", leases["a"].lease_id, "out://a"), 7.0)
    assert only(out, JobFinished) == []
    assert next(iter(book.jobs())).state is JobState.FAILED
    assert [d.task_id for d in book.dead_letters("j")] == ["b"]


def test_a_late_complete_of_a_requeued_task_wins_and_cancels_the_new_copy() -> None:
    """The old copy committed: the task is done and the copy leased since is told to stop."""
    book = TaskBook()
    join(book, "w", "n1")
    join(book, "v", "n2")
    book.handle(SubmitJob("j", [TaskSpec("a", "k", 0)], JobPolicy(lease_s=5)), 0.0)
    (old,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    book.handle(SchedulerTick(), 6.0)
    (new,) = only(book.handle(RequestTask("v", 1), 6.0), Lease)
    out = book.handle(Complete("w", "a", old.lease_id, "out://a"), 7.0)
    assert only(out, Ack)[0].outcome is AckOutcome.COMMITTED
    assert [c.lease_id for c in only(out, CancelLease)] == [new.lease_id]


def test_a_complete_for_a_lease_never_issued_does_not_overturn_a_dead_letter() -> None:
    """Only a lease the task really had may overturn its dead letter."""
    book = TaskBook()
    join(book, "w", "n1")
    book.handle(SubmitJob("j", [TaskSpec("a", "k", 0)], JobPolicy(max_attempts=1, lease_s=5)), 0.0)
    (lease,) = only(book.handle(RequestTask("w", 1), 0.0), Lease)
    book.handle(SchedulerTick(), 6.0)
    (ack,) = book.handle(Complete("w", "a", lease.lease_id + 7, "x"), 7.0)
    assert isinstance(ack, Ack) and ack.outcome is AckOutcome.IGNORED
    assert book.task("a").state is TaskState.DEAD


def test_restore_keeps_an_overturned_task_done() -> None:
    """The overturn is journaled: replaying the records gives a done task in a done job."""
    book = TaskBook()
    join(book, "w", "n1")
    jobs: dict[str, JobRecord] = {}
    rows: dict[str, TaskRecord] = {}
    specs = [TaskSpec("a", "k", 0)]

    def send(event: object, now: float) -> list[Command]:
        out = book.handle(event, now)  # type: ignore[arg-type]
        for c in only(out, Record):
            entry = c.entry
            if isinstance(entry, JobRecord):
                jobs[entry.job_id] = entry
            elif isinstance(entry, TaskRecord):
                rows[entry.task_id] = entry
            else:
                jobs[entry.job.job_id] = entry.job
        return out

    send(SubmitJob("j", specs, JobPolicy(max_attempts=1, lease_s=5)), 0.0)
    (lease,) = only(send(RequestTask("w", 1), 0.0), Lease)
    send(SchedulerTick(), 6.0)
    send(Complete("w", "a", lease.lease_id, "out://a"), 7.0)
    back = TaskBook.restore(jobs.values(), [(specs[0], rows["a"])])
    assert back.task("a").state is TaskState.DONE
    assert [j.state for j in back.jobs()] == [JobState.DONE]


def test_same_job_recognizes_a_repeated_submit() -> None:
    """same_job is true for the same tasks, policy and name, false for any difference."""
    book = TaskBook()
    specs = [TaskSpec("a", "k", 0), TaskSpec("b", "k", 1)]
    book.handle(SubmitJob("j", specs, NO_SPEC, "j"), 0.0)
    assert book.same_job("j", list(specs), NO_SPEC, "j")
    assert not book.same_job("j", specs[:1], NO_SPEC, "j")
    assert not book.same_job("j", [specs[0], TaskSpec("b", "k", 2)], NO_SPEC, "j")
    assert not book.same_job("j", specs, JobPolicy(max_attempts=5), "j")
    assert not book.same_job("other", specs, NO_SPEC, "other")


def test_a_job_file_may_give_a_task_its_own_kind() -> None:
    """[[tasks]] kind overrides [job].kind for that task; an empty one is a one-line error."""
    spec = parse_job(
        {"job": {"name": "mix", "kind": "plan"}, "tasks": [{"seed": 0}, {"seed": 1, "kind": "render"}]},
        "mix.toml",
    )
    assert [t.kind for t in spec.tasks()] == ["plan", "render"]
    with pytest.raises(ConfigError, match=r"mix.toml: \[\[tasks\]\] #1.kind must be a non-empty"):
        parse_job({"job": {"name": "mix", "kind": "plan"}, "tasks": [{"seed": 0, "kind": ""}]}, "mix.toml")
