"""The master's driver: group commit before any command, long polls, a failing journal."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from support.fake_clock import Clock
from troupe.runtime.errors import JournalError
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal_bulk import BULK_TASKS
from troupe.runtime.tasks.master.driver import Dispatcher
from troupe.runtime.tasks.state import (
    Ack,
    AckOutcome,
    CancelLease,
    Command,
    Complete,
    JobPolicy,
    JobSubmitted,
    Lease,
    Record,
    Reject,
    Resources,
    SchedulerTick,
    SubmitJob,
    TaskRecord,
    TaskSpec,
    WorkerJoined,
)


class FakeJournal:
    """Records appends; can hold an append (to look inside the window) or fail."""

    path = Path("fake.db")

    def __init__(self, fail: bool = False, hold: bool = False) -> None:
        self.appends: list[list[Record]] = []
        self._staged: list[Record] = []
        self.fail = fail
        self.entered = threading.Event()
        self.gate = threading.Event()
        if not hold:
            self.gate.set()

    def stage(self, records: Iterable[Record]) -> bool:
        self._staged = list(records)
        return bool(self._staged)

    def commit(self) -> None:  # the driver commits in a thread: the window a test looks inside
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"
        if self.fail:
            raise JournalError("journal fake.db: appending failed: disk I/O error")
        self.appends.append(self._staged)

    def rollback(self) -> None:
        self._staged = []


def make(journal: FakeJournal, side: list[Command] | None = None) -> tuple[Dispatcher, Clock]:
    clock = Clock()
    sink: Callable[[list[Command]], None] = side.extend if side is not None else lambda _: None
    return Dispatcher(TaskBook(), journal, sink, clock), clock  # type: ignore[arg-type]


async def until(condition: Callable[[], Any]) -> None:
    """A bounded poll of a condition, yielding to the loop between looks."""
    with anyio.fail_after(5):
        while not condition():
            await anyio.lowlevel.checkpoint()


def job(n: int, job_id: str = "j") -> SubmitJob:
    return SubmitJob(job_id, [TaskSpec(f"{job_id}-{i}", "k", i) for i in range(n)], JobPolicy(lease_s=30))


async def test_records_are_journaled_in_one_append_before_any_reply() -> None:
    """Events queued together share one append, and no caller hears back before it is done."""
    journal = FakeJournal(hold=True)
    driver, _ = make(journal)
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        submitted = driver.put(job(2))
        joined = driver.put(WorkerJoined("w", "n", Resources(2, 0), 2))
        leased = driver.put_request("w", 2, 0.0, "sig")
        await anyio.to_thread.run_sync(journal.entered.wait, 5)
        assert not (submitted.done() or joined.done() or leased.done())
        journal.gate.set()
        leases = [c for c in await leased if isinstance(c, Lease)]
        tg.cancel_scope.cancel()
    assert [lease.task_id for lease in leases] == ["j-0", "j-1"]
    (records,) = journal.appends
    assert isinstance(records[0].entry, JobSubmitted)
    assert [r.entry.task_id for r in records[1:] if isinstance(r.entry, TaskRecord)] == ["j-0", "j-1"]


async def test_a_parked_request_gets_the_task_a_later_submit_brings() -> None:
    """A request finding nothing pending waits, and is served as soon as a job arrives."""
    driver, _ = make(FakeJournal())
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        await driver.handle(WorkerJoined("w", "n", Resources(1, 0), 1))
        waiting = driver.put_request("w", 1, 30.0, "sig")
        await until(lambda: driver.statistics().parked == 1)
        assert not waiting.done()
        await driver.handle(job(1))
        (lease,) = await waiting
        tg.cancel_scope.cancel()
    assert isinstance(lease, Lease) and lease.task_id == "j-0"
    assert driver.statistics().retries >= 1


async def test_a_parked_request_ends_empty_at_its_deadline() -> None:
    """The long poll is bounded: once the clock passes its deadline, a tick answers it empty."""
    driver, clock = make(FakeJournal())
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        await driver.handle(WorkerJoined("w", "n", Resources(1, 0), 1))
        waiting = driver.put_request("w", 1, 2.0, "sig")
        await until(lambda: driver.statistics().parked == 1)
        clock.now += 1.0
        await driver.handle(SchedulerTick())
        assert not waiting.done()
        clock.now += 1.5
        await driver.handle(SchedulerTick())
        assert await waiting == []
        tg.cancel_scope.cancel()


async def test_one_fruitless_retry_per_signature() -> None:
    """Workers alike are not all retried when the first of them gets nothing."""
    driver, _ = make(FakeJournal())
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        for w in ("a", "b", "c"):
            await driver.handle(WorkerJoined(w, "n", Resources(1, 0), 1))
        parked = [driver.put_request(w, 1, 30.0, "same") for w in ("a", "b", "c")]
        await until(lambda: driver.statistics().parked == 3)
        before = driver.statistics().retries
        await driver.handle(SchedulerTick())
        assert driver.statistics().retries == before + 1
        await driver.handle(job(2))
        got = [await f for f in parked[:2]]
        assert [g[0].task_id for g in got] == ["j-0", "j-1"]  # type: ignore[attr-defined]
        assert not parked[2].done()
        tg.cancel_scope.cancel()


async def test_side_commands_go_to_the_side_after_the_append() -> None:
    """A CancelLease caused by another worker's Complete is performed, and only after journaling."""
    side: list[Command] = []
    journal = FakeJournal()
    driver, clock = make(journal, side)
    spec = SubmitJob("s", [TaskSpec("s-0", "k", 0), TaskSpec("s-1", "k", 1)], JobPolicy(lease_s=30))
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        await driver.handle(spec)
        for w in ("a", "b"):
            await driver.handle(WorkerJoined(w, "n", Resources(1, 0), 1))
        (first,) = await driver.request("a", 1, 0.0, "x")
        assert isinstance(first, Lease)
        await driver.request("b", 1, 0.0, "x")
        await driver.handle(Complete("b", "s-1", 2, "r"))
        clock.now += 100.0  # the slow copy of s-0 is now a straggler: b gets a backup
        (backup,) = await driver.request("b", 1, 0.0, "x")
        assert isinstance(backup, Lease) and backup.backup
        appended = len(journal.appends)
        await driver.handle(Complete("b", "s-0", backup.lease_id, "r"))
        tg.cancel_scope.cancel()
    cancels = [c for c in side if isinstance(c, CancelLease)]
    assert [(c.worker_id, c.task_id) for c in cancels] == [("a", "s-0")]
    assert len(journal.appends) == appended + 1


async def test_a_failing_append_stops_the_driver_and_every_caller() -> None:
    """When the journal fails, callers get JournalError, run() raises it, and nothing more is taken."""
    driver, _ = make(FakeJournal(fail=True))
    raised: list[JournalError] = []

    async def run() -> None:
        try:
            await driver.run()
        except JournalError as exc:
            raised.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with pytest.raises(JournalError, match="disk I/O error"):
            await driver.handle(job(1))
    assert len(raised) == 1
    with pytest.raises(JournalError):
        driver.put(job(1, "k"))


async def test_a_report_and_the_request_it_carries_are_one_entry_answered_together() -> None:
    """``put_report``: the report's Ack, then the leases its request got, in one reply and one
    append; a request the book refuses grants nothing and the report still stands."""
    journal = FakeJournal()
    driver, _ = make(journal)
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        await driver.handle(WorkerJoined("w", "n", Resources(1, 0), 1, prefetch=1))
        await driver.handle(job(4))
        (first,) = [c for c in await driver.request("w", 1, 0.0, "sig") if isinstance(c, Lease)]
        appends = len(journal.appends)
        reply = await driver.put_report(Complete("w", first.task_id, first.lease_id, "out"), "w", 2)
        in_one = len(journal.appends) == appends + 1
        # a worker the book does not know: its request is refused, not its report's answer
        stray = await driver.put_report(Complete("x", "j-1", 99, "out"), "x", 1)
        tg.cancel_scope.cancel()
    ack, *leases = reply
    assert isinstance(ack, Ack) and ack.outcome is AckOutcome.COMMITTED and in_one
    assert [(c.task_id, type(c)) for c in leases] == [("j-1", Lease), ("j-2", Lease)]  # one ahead
    assert len(stray) == 1 and isinstance(stray[0], Reject)  # lease 99 was never issued


async def test_a_big_submit_ends_its_batch_and_the_leases_of_its_tasks_come_in_the_next() -> None:
    """The rows of a job of BULK_TASKS tasks are written by the commit (in its thread): no
    lease of its tasks joins that commit; the request queued behind it, and a worker parked
    before it, are answered in the next append, with no other event to wake the driver."""
    journal = FakeJournal(hold=True)
    driver, _ = make(journal)
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        journal.gate.set()
        for w in ("parked", "asking"):
            await driver.handle(WorkerJoined(w, "n", Resources(1, 0), 1))
        parked = driver.put_request("parked", 1, 30.0, "p")
        await until(lambda: driver.statistics().parked == 1)
        journal.gate.clear()
        journal.entered.clear()
        before = len(journal.appends)
        submitted = driver.put(job(BULK_TASKS))
        asked = driver.put_request("asking", 1, 0.0, "a")
        await anyio.to_thread.run_sync(journal.entered.wait, 5)
        assert not (submitted.done() or asked.done() or parked.done())
        journal.gate.set()
        got = {"asking": await asked, "parked": await parked}
        await submitted
        tg.cancel_scope.cancel()
    bulk, after = journal.appends[before:]
    assert [type(r.entry) for r in bulk] == [JobSubmitted]
    leased = {w: [c.task_id for c in cmds if isinstance(c, Lease)] for w, cmds in got.items()}
    assert sorted(leased["asking"] + leased["parked"]) == ["j-0", "j-1"]
    assert sorted(r.entry.task_id for r in after if isinstance(r.entry, TaskRecord)) == ["j-0", "j-1"]


async def test_a_worker_parked_before_a_big_submit_gets_a_task_with_no_other_event() -> None:
    """The retry of parked requests that a big submit put off runs by itself after it."""
    journal = FakeJournal()
    driver, _ = make(journal)
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        await driver.handle(WorkerJoined("w", "n", Resources(1, 0), 1))
        parked = driver.put_request("w", 1, 30.0, "p")
        await until(lambda: driver.statistics().parked == 1)
        await driver.handle(job(BULK_TASKS))
        with anyio.fail_after(5):
            (lease,) = await parked
        tg.cancel_scope.cancel()
    assert isinstance(lease, Lease) and lease.task_id == "j-0"


async def test_exclusive_work_runs_between_batches_never_during_a_commit() -> None:
    """A compaction writes the journal and the book: it waits for the batch being committed,
    and the events that arrive meanwhile wait for it; what it raises is its caller's."""
    journal = FakeJournal(hold=True)
    driver, _ = make(journal)
    started: list[int] = []
    let_go = anyio.Event()

    async def work() -> str:
        started.append(len(journal.appends))  # the batch before it is committed
        await let_go.wait()
        return "folded"

    async def broken() -> None:
        raise ValueError("a bug in the work")

    results: list[str] = []
    async with anyio.create_task_group() as tg:
        await tg.start(driver.run)
        submitted = driver.put(job(1))
        await anyio.to_thread.run_sync(journal.entered.wait, 5)  # that batch's commit is running

        async def exclusive() -> None:
            results.append(await driver.exclusive(work))

        tg.start_soon(exclusive)
        await until(lambda: driver._exclusive)
        journal.gate.set()
        await until(lambda: started)
        assert started == [1] and submitted.done()
        joined = driver.put(WorkerJoined("w", "n", Resources(1, 0), 1))
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        assert not joined.done()  # no batch while the work runs
        let_go.set()
        await joined
        await until(lambda: results)
        with pytest.raises(ValueError, match="a bug in the work"):
            await driver.exclusive(broken)
        await driver.handle(job(1, "k"))  # the driver goes on
        tg.cancel_scope.cancel()
    assert results == ["folded"]
