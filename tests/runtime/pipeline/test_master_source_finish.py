"""MasterSource tells the master of a job's last items at once, not after its report window."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from anyio.lowlevel import checkpoint

from support.master_source_run import JobMaster, take_and_settle
from troupe.runtime.pipeline.source import MasterSource

pytestmark = pytest.mark.anyio


async def test_the_last_reports_go_at_once_and_the_run_ends() -> None:
    master = JobMaster(tasks=2)
    # A report window far longer than the test's bound: waiting it out would fail the test.
    source = MasterSource(master, "m", "job", slots=2, poll_s=0.05, report_window_s=3600.0)  # type: ignore[arg-type]
    await take_and_settle(source, 2)
    assert sorted(master.completed) == ["t0", "t1"]
    assert source.exhausted()


async def test_the_last_item_settled_during_a_report_window_closes_it() -> None:
    """An item's end opens a window for others to join its report while a lease is still out;
    when that last lease's item ends inside the window, nothing more can join: the reports go
    at once (the run's finalisation waited out the window for them)."""
    master = JobMaster(tasks=2)
    source = MasterSource(master, "m", "job", slots=2, poll_s=0.05, report_window_s=3600.0)  # type: ignore[arg-type]
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, lambda: None)
            items: list[Any] = []
            while len(items) < 2:
                await anyio.sleep(0.01)  # a bounded poll: the whole of it is under fail_after
                items += source.take(2)
            source.settle(items[0].task_id, "ok")
            for _ in range(100):  # the source's loop wakes and opens the window (t1 still out)
                await checkpoint()
            assert master.completed == []  # held for the window
            source.settle(items[1].task_id, "ok")
    assert sorted(master.completed) == ["t0", "t1"]
    assert source.exhausted()


class _DeadLetteringMaster(JobMaster):
    """A master whose one task is dead-lettered at its first failure; its answer to ``dead``
    waits for ``answer_dead`` (a master busy elsewhere)."""

    def __init__(self) -> None:
        super().__init__(tasks=1)
        self.failed: list[str] = []
        self.asked_dead = anyio.Event()
        self.answer_dead = anyio.Event()

    async def control(self, master: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        if msg_type == "fail":
            self.failed.append(payload["task_id"])
            return {"outcome": "dead"}
        if msg_type == "wait_job":
            return {"state": "failed" if self.failed else "running"}
        if msg_type == "dead":
            self.asked_dead.set()
            await self.answer_dead.wait()
            return [{"task_id": t, "error": "OSError: disk full"} for t in self.failed]
        return await super().control(master, msg_type, payload, timeout=timeout)


async def test_the_job_is_over_for_the_engine_only_with_its_dead_letters_known() -> None:
    """The engine ends its run once the source is exhausted and then reads the items the master
    dead-lettered: exhausted before the master answered which, the run reported none of them
    dead (the item had no outcome and no error)."""
    master = _DeadLetteringMaster()
    source = MasterSource(master, "m", "job", slots=1, poll_s=0.05)  # type: ignore[arg-type]
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, lambda: None)
            items: list[Any] = []
            while not items:
                await anyio.sleep(0.01)  # a bounded poll: the whole of it is under fail_after
                items += source.take(1)
            source.settle(items[0].task_id, "error", "OSError: disk full")
            await master.asked_dead.wait()
            assert not source.exhausted()  # the dead letters are not known yet
            master.answer_dead.set()
    assert source.exhausted()
    assert source.dead == {"t0": "OSError: disk full"}
