"""The getter's slots and reporters: a real getter and a real master, in memory.

Each slot is one long-lived coroutine that runs the held leases in turn, and reports go out by
reporters that stay for the next ones (no task spawned per lease). These tests pin what that
must not change: reports in flight at once do not wait for each other, and a copy the master
stops ends unreported while a runner's own ``TimeoutError`` is an ordinary failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from support.memory_master import MASTER, master_in_memory, until
from troupe.runtime.tasks.task_actor import LeasedTask


async def test_a_report_the_master_holds_does_not_hold_up_the_next_one(tmp_path: Path) -> None:
    """Two slots end their copies together; the master sits on the first report until the
    second has arrived: it can only arrive if the two reports are in flight at once."""
    completes: list[str] = []
    second_in = anyio.Event()

    async def done(task: LeasedTask) -> str:
        return f"out/{task.task_id}"

    async with master_in_memory(tmp_path) as m:
        master, client = m.master, m.client
        runtime = master.runtime
        assert runtime is not None
        complete = runtime.unregister_control("complete")

        async def holding(payload: Any) -> Any:
            completes.append(payload["task_id"])
            if len(completes) == 1:
                await second_in.wait()  # bounded by the job's wait below
            else:
                second_in.set()
            return await complete(payload)

        runtime.register_control("complete", holding)
        async with m.worker("w1", done, slots=2) as getter:
            await m.submit("j", 2)
            job = await client.control(MASTER, "wait_job", {"job_id": "j", "timeout_s": 30}, timeout=40)
            stats = getter.statistics()
    assert job["state"] == "done" and job["counts"]["done"] == 2
    assert sorted(completes) == ["j-000000", "j-000001"]
    assert (stats.started, stats.completed, stats.lost_reports) == (2, 2, 0)


async def test_a_runners_own_timeout_fails_the_task_and_a_stopped_copy_goes_unreported(
    tmp_path: Path,
) -> None:
    """A runner that raises TimeoutError reports a failure like any error (the dead letter
    says so); a copy the master stops (its job cancelled) ends unreported, and the slot
    takes the next lease."""
    started = anyio.Event()

    async def runner(task: LeasedTask) -> str:
        if task.job_id == "t":
            raise TimeoutError("the disk did not answer")
        if task.job_id == "d":
            return "out"
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("never")

    async with master_in_memory(tmp_path) as m, m.worker("w1", runner) as getter:
        client = m.client
        await m.submit("t", 1, max_attempts=1)
        job = await client.control(MASTER, "wait_job", {"job_id": "t", "timeout_s": 30}, timeout=40)
        failed = getter.statistics()
        dead = await client.control(MASTER, "dead", {"job_id": "t"}, timeout=10.0)
        await m.submit("c", 2)
        with anyio.fail_after(15):
            await started.wait()
        await client.control(MASTER, "cancel", {"job_id": "c"}, timeout=10.0)
        await until(lambda: getter.statistics().cancelled == 1)
        stopped = getter.statistics()
        await m.submit("d", 1)
        after = await client.control(MASTER, "wait_job", {"job_id": "d", "timeout_s": 30}, timeout=40)
    assert job["state"] == "failed" and (failed.failed, failed.cancelled) == (1, 0)
    assert "TimeoutError: the disk did not answer" in dead[0]["error"]
    assert (stopped.started, stopped.completed, stopped.failed, stopped.running) == (2, 0, 1, 0)
    assert after["state"] == "done"  # the stopped copy's slot ran the next lease
