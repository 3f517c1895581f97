"""Random events with master restarts among them: every guarantee holds across the restarts.

The workers keep what they hold over each restart (as real ones do: their copies run on and they
renew, report and register again as they would); the book is rebuilt from the journaled rows
alone. However the events fall: no task commits twice, no lease id is issued twice, a done task
is never leased again, and once the restarts stop every task ends (report mt 6: a restart holds
each lease over for its holder instead of voiding it).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.state import (
    Ack,
    AckOutcome,
    CancelLease,
    Command,
    Complete,
    Event,
    Fail,
    JobPolicy,
    JobRecord,
    JobState,
    JobSubmitted,
    Lease,
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

WORKERS = {f"w{i}": f"n{i % 2}" for i in range(4)}


class Cluster:
    """The book, the rows it journaled, and what each worker believes it holds."""

    def __init__(self) -> None:
        self.book = TaskBook()
        self.jobs: dict[str, JobRecord] = {}
        self.rows: dict[str, tuple[TaskSpec, TaskRecord]] = {}
        self.held: dict[int, Lease] = {}  # lease id -> the lease, while its worker holds it
        self.registered: set[str] = set()
        self.issued: set[int] = set()
        self.commits: Counter[str] = Counter()
        self.now = 0.0
        self.held_over: set[int] = set()  # leases held when the master last restarted
        self.kept = 0  # renewals of those the restarted master accepted

    def send(self, event: Event) -> list[Command]:
        out = self.book.handle(event, self.now)
        for c in out:
            if isinstance(c, Record):
                self.journal(c.entry)
            elif isinstance(c, Lease):
                assert c.lease_id not in self.issued, "a lease id was issued twice"
                assert not self.commits[c.task_id], "a done task was leased again"
                self.issued.add(c.lease_id)
                self.held[c.lease_id] = c
            elif isinstance(c, CancelLease):
                self.held.pop(c.lease_id, None)
            elif isinstance(c, Ack):
                if c.outcome is AckOutcome.COMMITTED:
                    self.commits[c.task_id] += 1
                    assert self.commits[c.task_id] == 1, "a task was committed twice"
                if c.outcome is not AckOutcome.RENEWED:
                    self.held.pop(c.lease_id, None)
                elif c.lease_id in self.held_over:
                    self.kept += 1
            elif isinstance(c, Reject) and isinstance(c.event, Renew | Complete | Fail):
                self.held.pop(c.event.lease_id, None)  # the worker drops the copy
        return out

    def journal(self, entry: object) -> None:
        if isinstance(entry, JobSubmitted):
            self.jobs[entry.job.job_id] = entry.job
            for spec in entry.tasks:
                record = TaskRecord(
                    spec.task_id, entry.job.job_id, TaskState.PENDING, 0, 0.0, 0, None, None, None
                )
                self.rows[spec.task_id] = (spec, record)
        elif isinstance(entry, JobRecord):
            self.jobs[entry.job_id] = entry
        elif isinstance(entry, TaskRecord):
            self.rows[entry.task_id] = (self.rows[entry.task_id][0], entry)
        else:
            raise AssertionError(f"unexpected record {entry!r}")

    def restart(self) -> None:
        """A new master on the journal: it knows no worker, and the workers hold on."""
        self.book = TaskBook.restore(self.jobs.values(), list(self.rows.values()))
        self.registered.clear()
        self.held_over = set(self.held)

    def join(self, worker_id: str) -> None:
        self.send(WorkerJoined(worker_id, WORKERS[worker_id], Resources(2, 0), 2, prefetch=1))
        self.registered.add(worker_id)

    def leave(self, worker_id: str) -> None:
        """The worker dies: what it held is gone with it."""
        if worker_id in self.registered:
            self.send(WorkerLeft(worker_id, "killed"))
            self.registered.discard(worker_id)
        for lease_id in [i for i, lease in self.held.items() if lease.worker_id == worker_id]:
            del self.held[lease_id]


@pytest.mark.parametrize("seed", range(6))
def test_restarts_among_random_events_commit_each_task_once_and_reuse_no_lease_id(seed: int) -> None:
    rng = random.Random(seed)
    c = Cluster()
    policy = JobPolicy(
        max_attempts=50,
        lease_s=5.0,
        backoff_base_s=0.0,
        speculation=Speculation(factor=1.0, min_runtime_s=0.5, max_copies=1),
    )
    total = 0
    for j in range(3):
        tasks = [TaskSpec(f"j{j}-{i}", "k", i) for i in range(rng.randint(20, 60))]
        c.send(SubmitJob(f"job{j}", tasks, policy))
        total += len(tasks)
    for worker_id in WORKERS:
        c.join(worker_id)

    actions = ["request", "complete", "fail", "renew", "tick", "restart", "join", "leave"]
    weights = [25, 20, 3, 20, 15, 1.5, 6, 1]
    for _ in range(3000):
        action = rng.choices(actions, weights)[0]
        held = sorted(c.held)
        if action == "request" and c.registered:
            c.send(RequestTask(rng.choice(sorted(c.registered)), rng.randint(1, 3)))
        elif action in ("complete", "fail", "renew") and held:
            lease = c.held[rng.choice(held)]
            if action == "complete":
                c.send(Complete(lease.worker_id, lease.task_id, lease.lease_id, "r"))
            elif action == "fail":
                c.send(Fail(lease.worker_id, lease.task_id, lease.lease_id, "err"))
            else:
                c.send(Renew(lease.worker_id, lease.task_id, lease.lease_id))
        elif action == "tick":
            c.now += rng.uniform(0, 2)
            c.send(SchedulerTick())
        elif action == "restart":
            c.restart()
        elif action == "join":
            unregistered = sorted(set(WORKERS) - c.registered)
            if unregistered:
                c.join(rng.choice(unregistered))
        elif action == "leave":
            c.leave(rng.choice(sorted(WORKERS)))

    # wind down: every worker registered, each round renews or completes what it holds
    for worker_id in sorted(set(WORKERS) - c.registered):
        c.join(worker_id)
    for _ in range(2000):
        if all(j.state is not JobState.RUNNING for j in c.book.jobs()):
            break
        c.now += 1.0
        c.send(SchedulerTick())
        c.send(RequestTask(rng.choice(sorted(WORKERS)), 3))
        for lease_id in sorted(c.held):
            lease = c.held.get(lease_id)
            if lease is None:
                continue  # cancelled by an earlier report of this round
            if rng.random() < 0.5:
                c.send(Complete(lease.worker_id, lease.task_id, lease.lease_id, "r"))
            else:
                c.send(Renew(lease.worker_id, lease.task_id, lease.lease_id))
    assert c.kept, "no renewal of a lease held over a restart: the test tried nothing"
    assert all(j.state is JobState.DONE for j in c.book.jobs())
    assert sum(c.commits.values()) == total and set(c.commits.values()) == {1}
    stats = c.book.statistics()
    assert stats.tasks[TaskState.DONE] == total and stats.leases_outstanding == 0
