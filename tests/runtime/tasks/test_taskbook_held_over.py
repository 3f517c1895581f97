"""A master restart holds each leased task's last lease over for its holder (report mt 6).

Before, a restart voided every lease: the holders' renewals were refused, each running task was
cancelled and run again from zero. Now the journaled lease stays: the worker that names its
lease id (by a Renew or a report, registered again or not yet) holds it on; one that no worker
names within the job's ``lease_s`` from the first event goes back, no attempt counted; an older
copy's Renew is refused, and its Complete still commits. Each case is a real journal replayed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.journal_drive import drive, leases
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.state import (
    Ack,
    AckOutcome,
    CancelJob,
    CancelLease,
    Command,
    Complete,
    Decline,
    Event,
    Fail,
    JobPolicy,
    Lease,
    NodeDead,
    Reject,
    Renew,
    RequestTask,
    Resources,
    SchedulerTick,
    Speculation,
    SubmitJob,
    TaskSpec,
    TaskState,
    WorkerJoined,
    WorkerLeft,
)

LEASE_S = 10.0
POLICY = JobPolicy(max_attempts=3, lease_s=LEASE_S, backoff_base_s=0.0)


class Restarted:
    """A master's book and journal before a restart, and the book replayed after it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.book = TaskBook()
        self.journal = Journal.open(path, create=True)

    def before(self, event: Event, now: float = 0.0) -> list[Command]:
        return drive(self.book, self.journal, event, now)

    def restart(self) -> None:
        """Close the journal (a SIGKILL loses nothing either) and replay it, as a new master."""
        self.journal.close()
        self.journal = Journal.open(self.path)
        self.book = self.journal.replay()

    def after(self, event: Event, now: float) -> list[Command]:
        return drive(self.book, self.journal, event, now)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[Restarted]:
    m = Restarted(tmp_path / "journal.db")
    try:
        yield m
    finally:
        m.journal.close()


def running(m: Restarted, tasks: int = 2, policy: JobPolicy = POLICY) -> list[Lease]:
    """Submit a job, lease ``w`` (on node n) one task per slot, then restart the master."""
    m.before(SubmitJob("j", [TaskSpec(f"t{i}", "k", i) for i in range(tasks)], policy))
    m.before(WorkerJoined("w", "n", Resources(1, 0), 1, prefetch=1))
    granted = leases(m.before(RequestTask("w", 2)))
    m.restart()
    return granted


def acks(out: list[Command]) -> list[AckOutcome]:
    return [c.outcome for c in out if isinstance(c, Ack)]


def test_a_leased_task_stays_leased_and_its_holder_renews_and_completes_it(master: Restarted) -> None:
    first, _ = running(master)
    assert master.book.task("t0").state is TaskState.LEASED
    master.after(WorkerJoined("w", "n", Resources(1, 0), 1), 100.0)
    # not leased to anyone else meanwhile
    master.after(WorkerJoined("other", "n2", Resources(4, 0), 4), 100.0)
    assert leases(master.after(RequestTask("other", 4), 100.0)) == []
    out = master.after(Renew("w", "t0", first.lease_id), 105.0)
    assert out == [Ack("w", "t0", first.lease_id, AckOutcome.RENEWED, 105.0 + LEASE_S)]
    assert master.book.leases_of("w") == {first.lease_id: "t0"}  # the one it named
    master.after(SchedulerTick(), 112.0)  # past the first deadline (110): renewed, kept
    assert master.book.task("t0").state is TaskState.LEASED
    out = master.after(Complete("w", "t0", first.lease_id, "out/t0"), 113.0)
    assert acks(out) == [AckOutcome.COMMITTED]
    assert master.book.task("t0").attempts == 0
    assert not [c for c in out if isinstance(c, CancelLease)]


def test_a_holder_that_renews_before_it_registers_keeps_the_lease_and_its_row_takes_it(
    master: Restarted,
) -> None:
    """A busy worker renews before it asks for work (it has no free slot): renewed, and the row it
    registers with holds the lease (a worker that then leaves gives it back, an attempt lost)."""
    first, ahead = running(master)
    out = master.after(Renew("w", "t0", first.lease_id), 50.0)
    assert acks(out) == [AckOutcome.RENEWED]
    # another worker may not take it over by the same id
    out = master.after(Renew("w9", "t0", first.lease_id), 50.5)
    assert [type(c) for c in out] == [Reject] and "belongs to worker 'w'" in out[0].reason  # type: ignore[union-attr]
    master.after(WorkerJoined("w", "n", Resources(1, 0), 1), 51.0)
    assert master.book.worker_load("w").used == 1
    assert master.book.leases_of("w") == {first.lease_id: "t0"}
    master.after(WorkerLeft("w", "killed"), 52.0)
    t0 = master.book.task("t0")
    assert (t0.state, t0.attempts) == (TaskState.PENDING, 1)
    assert master.book.task(ahead.task_id).state is TaskState.LEASED  # still waits for its holder


def test_a_lease_nobody_names_goes_back_after_one_lease_without_an_attempt(master: Restarted) -> None:
    first, ahead = running(master)
    master.after(WorkerJoined("v", "n2", Resources(2, 0), 2), 200.0)  # the first event: lease_s from here
    assert leases(master.after(RequestTask("v", 2), 209.9)) == []
    out = master.after(SchedulerTick(), 210.0)
    assert not [c for c in out if isinstance(c, CancelLease)]  # no holder known to tell
    for task_id in ("t0", "t1"):
        info = master.book.task(task_id)
        assert (info.state, info.attempts) == (TaskState.PENDING, 0)
    again = leases(master.after(RequestTask("v", 2), 210.0))
    assert sorted(g.task_id for g in again) == ["t0", "t1"]
    assert min(g.lease_id for g in again) > ahead.lease_id  # a lease id is never issued twice
    # the old holder's late Renew is refused; its late Complete still commits, once
    assert isinstance(master.after(Renew("w", "t0", first.lease_id), 211.0)[0], Reject)
    assert acks(master.after(Complete("w", "t0", first.lease_id, "r"), 211.0)) == [AckOutcome.COMMITTED]
    assert acks(master.after(Complete("v", "t0", again[0].lease_id, "r"), 212.0)) == [AckOutcome.DUPLICATE]


def test_a_claimed_lease_that_goes_silent_expires_as_any_lease(master: Restarted) -> None:
    (first,) = running(master, tasks=1)
    master.after(Renew("w", "t0", first.lease_id), 0.0)
    out = master.after(SchedulerTick(), LEASE_S)
    assert [c.worker_id for c in out if isinstance(c, CancelLease)] == ["w"]
    info = master.book.task("t0")
    assert (info.state, info.attempts) == (TaskState.PENDING, 1)


def test_a_newer_lease_id_beats_an_older_one(master: Restarted) -> None:
    """Two copies ran before the restart (a backup on b): the journal holds the newer lease id,
    so that copy runs on; the older one's Renew is refused, and its Complete still commits."""
    policy = JobPolicy(lease_s=LEASE_S, speculation=Speculation(factor=1.0, min_runtime_s=1.0))
    master.before(SubmitJob("j", [TaskSpec("fast", "k", 0), TaskSpec("slow", "k", 1)], policy))
    master.before(WorkerJoined("a", "n1", Resources(2, 0), 2))
    master.before(WorkerJoined("b", "n2", Resources(1, 0), 1))
    by_task = {g.task_id: g for g in leases(master.before(RequestTask("a", 2)))}
    master.before(Complete("a", "fast", by_task["fast"].lease_id, "r", run_s=1.0), 1.0)
    (backup,) = leases(master.before(RequestTask("b", 1), 5.0))
    assert (backup.task_id, backup.backup) == ("slow", True)
    old = by_task["slow"]
    master.restart()
    assert isinstance(master.after(Renew("a", "slow", old.lease_id), 6.0)[0], Reject)
    assert acks(master.after(Renew("b", "slow", backup.lease_id), 6.0)) == [AckOutcome.RENEWED]
    out = master.after(Complete("a", "slow", old.lease_id, "r"), 7.0)
    assert acks(out) == [AckOutcome.COMMITTED]
    assert [(c.worker_id, c.lease_id) for c in out if isinstance(c, CancelLease)] == [("b", backup.lease_id)]


def test_a_held_over_lease_ahead_given_back_or_a_failure_is_settled_as_before(master: Restarted) -> None:
    first, ahead = running(master)
    out = master.after(Decline("w", ahead.task_id, ahead.lease_id, "waited", given_back=True), 1.0)
    assert acks(out) == [AckOutcome.RETURNED]
    assert (master.book.task(ahead.task_id).state, master.book.task(ahead.task_id).attempts) == (
        TaskState.PENDING,
        0,
    )
    out = master.after(Fail("w", "t0", first.lease_id, "ValueError: x"), 2.0)
    assert acks(out) == [AckOutcome.RECORDED]
    assert master.book.task("t0").attempts == 1


def test_a_cancelled_job_tells_only_the_holders_that_spoke(master: Restarted) -> None:
    first, _ = running(master)
    master.after(Renew("w", "t0", first.lease_id), 1.0)
    out = master.after(CancelJob("j"), 2.0)
    assert [(c.worker_id, c.lease_id) for c in out if isinstance(c, CancelLease)] == [("w", first.lease_id)]
    assert {master.book.task(t).state for t in ("t0", "t1")} == {TaskState.CANCELLED}
    assert master.book.statistics().leases_outstanding == 0


def test_a_second_restart_before_anyone_named_it_holds_the_lease_over_again(master: Restarted) -> None:
    (first,) = running(master, tasks=1)
    master.restart()
    assert master.book.task("t0").state is TaskState.LEASED
    assert acks(master.after(Renew("w", "t0", first.lease_id), 0.0)) == [AckOutcome.RENEWED]


def test_a_master_whose_earlier_holders_are_gone_releases_what_nobody_named(master: Restarted) -> None:
    """A one-host run's own master: the run that held its leases was its process."""
    first, ahead = running(master)
    master.after(Renew("w", "t0", first.lease_id), 0.0)  # named: kept
    assert master.book.release_held_over() == 1
    assert (master.book.task(ahead.task_id).state, master.book.task(ahead.task_id).attempts) == (
        TaskState.PENDING,
        0,
    )
    assert master.book.task("t0").state is TaskState.LEASED
    assert master.book.statistics().leases_outstanding == 1


def test_a_holder_that_dies_before_it_registers_gives_its_leases_back_at_once(master: Restarted) -> None:
    """A busy worker renewed what it held, then died before it registered again: its node's
    worker_left puts each lease back at once (each an attempt lost, as its expiry would), not a
    lease later."""
    first, ahead = running(master)
    master.after(Renew("w", "t0", first.lease_id, "n"), 1.0)
    master.after(Renew("w", ahead.task_id, ahead.lease_id, "n"), 1.0)
    assert master.book.leases_of("w") == {first.lease_id: "t0", ahead.lease_id: ahead.task_id}
    out = master.after(WorkerLeft("w", "exit code -9"), 2.0)
    assert not [c for c in out if isinstance(c, Reject)]
    for task_id in ("t0", ahead.task_id):
        info = master.book.task(task_id)
        assert (info.state, info.attempts) == (TaskState.PENDING, 1)
    assert master.book.leases_of("w") == {}
    master.after(WorkerJoined("v", "n2", Resources(2, 0), 2), 3.0)
    assert sorted(g.task_id for g in leases(master.after(RequestTask("v", 2), 3.0))) == ["t0", "t1"]


def test_a_holder_whose_node_dies_before_it_registers_gives_its_leases_back_at_once(
    master: Restarted,
) -> None:
    first, ahead = running(master)
    master.after(Renew("w", "t0", first.lease_id, "n"), 1.0)
    master.after(Renew("x", "zz", 999, "n"), 1.0)  # refused: it names no lease, and holds none
    master.after(NodeDead("n2"), 2.0)  # another node: nothing of w's
    assert master.book.task("t0").state is TaskState.LEASED
    master.after(NodeDead("n"), 3.0)
    t0 = master.book.task("t0")
    assert (t0.state, t0.attempts) == (TaskState.PENDING, 1)
    # the lease it did not name still waits for its holder, no attempt counted
    assert master.book.task(ahead.task_id).state is TaskState.LEASED
    assert master.book.leases_of("w") == {}


@pytest.mark.parametrize(("renewed_by", "registered_by"), [(7, 8), (7, 7), (7, 0), (0, 8)])
def test_another_process_of_the_holders_name_that_registers_gives_its_leases_back_at_once(
    master: Restarted, renewed_by: int, registered_by: int
) -> None:
    """lo 2: a busy worker renewed what it held (its process, pid 7), then died, and the one its
    node started in its place (pid 8) registered before the node's worker_left for the dead one:
    it took the dead one's lease, whose task then waited out a lease. Now the lease goes back at
    once, an attempt lost, as that worker_left would have put it; the same process registering
    again keeps it, as does one where either side did not say its pid (an older worker)."""
    first, ahead = running(master)
    master.after(Renew("w", "t0", first.lease_id, "n", renewed_by), 1.0)
    master.after(WorkerJoined("w", "n", Resources(1, 0), 1, pid=registered_by), 2.0)
    t0 = master.book.task("t0")
    if renewed_by != registered_by and renewed_by and registered_by:
        assert (t0.state, t0.attempts) == (TaskState.PENDING, 1)
        assert master.book.leases_of("w") == {}
        assert [g.task_id for g in leases(master.after(RequestTask("w", 1), 2.0))] == ["t0"]
    else:
        assert (t0.state, t0.attempts) == (TaskState.LEASED, 0)
        assert master.book.leases_of("w") == {first.lease_id: "t0"}
    assert master.book.task(ahead.task_id).state is TaskState.LEASED  # not named: waits for its holder


@pytest.mark.parametrize(("first", "again"), [(7, 7), (7, 8), (7, 0), (0, 0)])
def test_the_same_process_registering_twice_keeps_its_leases_another_rejoins(
    master: Restarted, first: int, again: int
) -> None:
    """jx 6: a busy worker renewed what it held over the restart and registered; its first
    registration was answered after it gave up waiting (behind a slow batch), and it sent it
    again. The second was taken as the worker leaving and joining again: its running task was put
    back, an attempt lost (dead on the last one). The same process (pid) registering again is
    the same registration now, its leases kept; another process of the name, or one that says no
    pid, still rejoins."""
    lease, _ = running(master)
    master.after(Renew("w", "t0", lease.lease_id, "n", first), 1.0)
    master.after(WorkerJoined("w", "n", Resources(1, 0), 1, pid=first), 2.0)
    master.after(WorkerJoined("w", "n", Resources(1, 0), 1, pid=again), 3.0)
    t0 = master.book.task("t0")
    if first and first == again:
        assert (t0.state, t0.attempts) == (TaskState.LEASED, 0)
        assert master.book.leases_of("w") == {lease.lease_id: "t0"}
        out = master.after(Renew("w", "t0", lease.lease_id, "n", first), 4.0)
        assert acks(out) == [AckOutcome.RENEWED]
        assert leases(master.after(RequestTask("w", 1), 4.0)) == []  # its slot is still taken
    else:
        assert (t0.state, t0.attempts) == (TaskState.PENDING, 1)
        assert master.book.leases_of("w") == {}
