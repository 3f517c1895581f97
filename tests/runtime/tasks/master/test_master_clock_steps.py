"""A step of the master's wall clock (NTP at boot, ``date -s``) changes no duration: leases,
backoffs and a job's rate are measured on its monotonic clock, and the wall clock is only
journaled or shown as a time.

Both clocks are the test's fakes: the wall clock steps an hour at once, the monotonic one moves
as much as the test says, and the master looks (``tick``) when told.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.fake_clock import Clock
from support.log_capture import module_logs
from support.memory_master import master_in_memory
from troupe.runtime.tasks import book as book_module
from troupe.runtime.tasks.state import TaskState

WORKER = {"worker_id": "n1/w1", "node": "n1", "endpoint": "mem://nowhere", "slots": 1, "kinds": ["k"]}
REQUEST = {"worker_id": "n1/w1", "free_slots": 1, "wait_s": 0}
HOUR = 3600.0


def clocks() -> tuple[Clock, Clock]:
    """The master's monotonic clock and its wall clock."""
    return Clock(1000.0), Clock(1_800_000_000.0)


async def test_a_forward_step_expires_no_lease_and_an_unrenewed_lease_still_expires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, wall = clocks()
    async with master_in_memory(tmp_path, wall_clock=wall, clock=clock) as m:
        await m.call("register_worker", WORKER)
        await m.submit("s", 1, lease_s=60, max_attempts=2)
        [lease] = (await m.call("request_task", REQUEST))["leases"]
        task_id, lease_id = lease["task_id"], lease["lease_id"]
        assert lease["ttl"] == 60
        with module_logs(monkeypatch, book_module) as logs:
            wall.now += HOUR  # NTP steps the master's host an hour forward, a second later
            clock.now += 1
            await m.master.tick()
            assert m.master.book.task(task_id).state is TaskState.LEASED
            renew = {"worker_id": "n1/w1", "task_id": task_id, "lease_id": lease_id}
            assert await m.call("renew", renew) == {"outcome": "renewed", "ttl": 60}

            wall.now -= 2 * HOUR  # and two hours back: the lease is not held an hour longer
            clock.now += 60.5  # no renewal for longer than the lease
            await m.master.tick()
        info = m.master.book.task(task_id)
        assert (info.state, info.attempts) == (TaskState.PENDING, 1)
        assert m.master.lease_expiries == 1
    expired = [e for e in logs if e["event"] == "lease_expired"]
    assert [(e["log_level"], e["task_id"], e["lease_id"]) for e in expired] == [("info", task_id, lease_id)]


async def test_a_backward_step_holds_no_retry_back_and_not_before_is_journaled_on_the_wall_clock(
    tmp_path: Path,
) -> None:
    clock, wall = clocks()
    async with master_in_memory(tmp_path, wall_clock=wall, clock=clock) as m:
        await m.call("register_worker", WORKER)
        await m.submit("f", 1, max_attempts=3, backoff_base_s=5)
        [lease] = (await m.call("request_task", REQUEST))["leases"]
        task_id = lease["task_id"]
        report = {"worker_id": "n1/w1", "task_id": task_id, "lease_id": lease["lease_id"]}
        await m.call("fail", {**report, "error": "boom", "traceback": ""})
        info = m.master.book.task(task_id)
        assert (info.state, info.not_before) == (TaskState.FAILED, wall.now + 5)  # a time, shown

        wall.now -= HOUR  # NTP steps the master's host an hour back
        clock.now += 4.9
        await m.master.tick()
        assert m.master.book.task(task_id).state is TaskState.FAILED
        clock.now += 0.2  # the five seconds are over
        await m.master.tick()
        assert m.master.book.task(task_id).state is TaskState.PENDING
        [again] = (await m.call("request_task", REQUEST))["leases"]
        assert (again["task_id"], again["attempt"]) == (task_id, 2)


async def test_a_job_rate_is_measured_on_the_monotonic_clock(tmp_path: Path) -> None:
    clock, wall = clocks()
    async with master_in_memory(tmp_path, wall_clock=wall, clock=clock) as m:
        await m.call("register_worker", WORKER)
        await m.submit("r", 2)
        submitted = wall.now
        [lease] = (await m.call("request_task", REQUEST))["leases"]
        report = {"worker_id": "n1/w1", "task_id": lease["task_id"], "lease_id": lease["lease_id"]}
        await m.call("complete", {**report, "result_ref": "out://a"})
        wall.now -= HOUR
        clock.now += 10
        [job] = await m.call("jobs")
    assert job["started_at"] == submitted  # shown as a time: the wall clock's
    assert job["done_per_s"] == 0.1  # 1 done in 10 s, not -0.0 over -3590 s
