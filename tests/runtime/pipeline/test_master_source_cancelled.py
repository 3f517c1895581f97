"""MasterSource halts when its job is cancelled at the master, and only then.

The master tells a worker whose lease it takes back (``cancel_lease``): the job was cancelled,
or the lease expired, or another copy finished first. The source asks the master which: a
cancelled job halts the run (the engine then stops its items in flight); a lease taken back
while the job runs on changes nothing. A renewal the master refuses makes the source ask too,
in case the ``cancel_lease`` was lost.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from support.master_source_run import RuntimeControls
from troupe.runtime.pipeline.source import MasterSource

pytestmark = pytest.mark.anyio

BOUND_S = 20.0


class _FakeMaster(RuntimeControls):
    """Answers a MasterSource's control calls as a master with one job of ``tasks`` tasks, and
    holds the control handlers the source registers, as a runtime does."""

    node = "n"
    address = "tcp://127.0.0.1:1"

    def __init__(self, tasks: int, ttl: float = 60.0) -> None:
        super().__init__()
        self.todo = [
            {"task_id": f"t{i}", "lease_id": i + 1, "seed": i, "attempt": 1, "ttl": ttl} for i in range(tasks)
        ]
        self.state = "running"
        self.renewal = "renewed"
        self.calls: list[str] = []
        self.asked_state = anyio.Event()

    async def control(self, master: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        self.calls.append(msg_type)
        if msg_type == "request_task":
            if not self.todo:
                await anyio.sleep(float(payload["wait_s"]))
                return {"leases": []}
            granted, self.todo = self.todo[: payload["free_slots"]], self.todo[payload["free_slots"] :]
            return {"leases": granted}
        if msg_type == "renew":
            return {"outcome": self.renewal, "ttl": 60.0}
        if msg_type == "wait_job":
            self.asked_state.set()
            return {"state": self.state, "total": 2, "counts": {"done": 0, "cancelled": 2}}
        return {}

    async def cancel_lease(self, worker_id: str, task_id: str, reason: str) -> Any:
        handler = self.control_handlers["cancel_lease"]
        return await handler({"worker_id": worker_id, "task_id": task_id, "lease_id": 1, "reason": reason})


async def _holding(master: _FakeMaster, source: MasterSource, run: Any) -> None:
    """Start the source and wait until it holds both items (leased, taken by the 'engine')."""
    run(source.run, lambda: None)
    taken: list[Any] = []
    while len(taken) < 2:
        await anyio.sleep(0.01)  # a bounded poll: the caller's fail_after bounds it
        taken += source.take(2)


async def test_a_cancelled_job_halts_the_source() -> None:
    master = _FakeMaster(tasks=2)
    source = MasterSource(master, "m", "job", slots=2, poll_s=0.05)  # type: ignore[arg-type]
    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            await _holding(master, source, tg.start_soon)
            master.state = "cancelled"
            assert await master.cancel_lease(source.worker_id, "t0", "job cancelled") is True
            while source.halted() is None:
                await anyio.sleep(0.01)
            # The source's run ends by itself: nothing more to lease, nothing to give back.
    why = source.halted()
    assert why is not None and "'job' was cancelled" in why and "troupe ctl cancel" in why
    # The master's count lacks an item committed as the cancel came: said as the master's.
    assert "items recorded done" in why and "also that of items in flight" in why, why
    assert source.exhausted()
    source.settle("t0", "ok")  # an item that ended as the run stopped: nothing to report
    assert "complete" not in master.calls
    assert "cancel_lease" not in master.control_handlers  # the runtime is left as it was


async def test_a_lease_taken_back_while_the_job_runs_changes_nothing() -> None:
    master = _FakeMaster(tasks=2)
    source = MasterSource(master, "m", "job", slots=2, poll_s=0.05)  # type: ignore[arg-type]
    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            await _holding(master, source, tg.start_soon)
            assert await master.cancel_lease("someone-else", "t0", "job cancelled") is False
            assert await master.cancel_lease(source.worker_id, "t9", "job cancelled") is False
            assert await master.cancel_lease(source.worker_id, "t0", "lease expired") is True
            await master.asked_state.wait()  # it asked, and the job runs on
            assert source.halted() is None
            for task_id in ("t0", "t1"):
                source.settle(task_id, "ok")
            master.state = "done"
    assert source.halted() is None
    assert master.calls.count("complete") == 2


async def test_a_refused_renewal_makes_the_source_ask_after_its_job() -> None:
    master = _FakeMaster(tasks=2, ttl=1.5)  # renewed every 0.5 s
    source = MasterSource(master, "m", "job", slots=2, poll_s=0.05)  # type: ignore[arg-type]
    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            await _holding(master, source, tg.start_soon)
            master.state, master.renewal = "cancelled", "rejected"  # no cancel_lease: it was lost
            while source.halted() is None:
                await anyio.sleep(0.01)
    assert source.exhausted()
