"""The getter's slots and reporters: a real getter and a real master, in memory.

Each slot is one long-lived coroutine that runs the held leases in turn, and reports go out by
reporters that stay for the next ones (no task spawned per lease). These tests pin what that
must not change: reports in flight at once do not wait for each other, and a copy the master
stops ends unreported while a runner's own ``TimeoutError`` is an ordinary failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.tasks.getter import GetterConfig, TaskGetter, install_task_control
from troupe.runtime.tasks.master.master import Master, MasterConfig, open_journal
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"
Runner = Callable[[LeasedTask], Awaitable[str | None]]


async def until(condition: Callable[[], Any], timeout: float = 15.0) -> None:
    """A bounded poll of a condition, yielding to the loop between looks."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.001)


@asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Master, Runtime, MemoryHub]]:
    """A master in memory, and a client runtime that calls it."""
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    master = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(master.run)
            await master.ready.wait()
            async with Runtime("client", "client", hub.transport()) as client:
                yield master, client, hub
                master.stop()
                tg.cancel_scope.cancel()
    finally:
        journal.close()


@asynccontextmanager
async def worker(
    hub: MemoryHub, master: Master, runner: Runner, name: str = "w1", **cfg: Any
) -> AsyncIterator[TaskGetter]:
    """One worker ``n1/<name>`` in its own runtime, registered; gone when the block ends."""
    async with Runtime("n1", name, hub.transport()) as rt:
        options = {"wait_s": 0.3, "call_timeout_s": 2.0, "retry_s": 0.02, **cfg}
        getter = TaskGetter(rt, MASTER, GetterConfig(f"n1/{name}", "n1", **options), runner)
        install_task_control(rt, {getter.worker_id: getter})
        async with anyio.create_task_group() as tg:
            tg.start_soon(getter.run)
            await until(lambda: getter.worker_id in master.workers())
            yield getter
            tg.cancel_scope.cancel()


async def submit(client: Runtime, name: str, count: int, **job: Any) -> None:
    payload = {"job": {"job": {"name": name, "kind": "k", "count": count, **job}}, "source": "t"}
    await client.control(MASTER, "submit", payload, timeout=10.0)


async def test_a_report_the_master_holds_does_not_hold_up_the_next_one(tmp_path: Path) -> None:
    """Two slots end their copies together; the master sits on the first report until the
    second has arrived: it can only arrive if the two reports are in flight at once."""
    completes: list[str] = []
    second_in = anyio.Event()

    async def done(task: LeasedTask) -> str:
        return f"out/{task.task_id}"

    async with cluster(tmp_path) as (master, client, hub):
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
        async with worker(hub, master, done, slots=2) as getter:
            await submit(client, "j", 2)
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

    async with cluster(tmp_path) as (master, client, hub), worker(hub, master, runner) as getter:
        await submit(client, "t", 1, max_attempts=1)
        job = await client.control(MASTER, "wait_job", {"job_id": "t", "timeout_s": 30}, timeout=40)
        failed = getter.statistics()
        dead = await client.control(MASTER, "dead", {"job_id": "t"}, timeout=10.0)
        await submit(client, "c", 2)
        with anyio.fail_after(15):
            await started.wait()
        await client.control(MASTER, "cancel", {"job_id": "c"}, timeout=10.0)
        await until(lambda: getter.statistics().cancelled == 1)
        stopped = getter.statistics()
        await submit(client, "d", 1)
        after = await client.control(MASTER, "wait_job", {"job_id": "d", "timeout_s": 30}, timeout=40)
    assert job["state"] == "failed" and (failed.failed, failed.cancelled) == (1, 0)
    assert "TimeoutError: the disk did not answer" in dead[0]["error"]
    assert (stopped.started, stopped.completed, stopped.failed, stopped.running) == (2, 0, 1, 0)
    assert after["state"] == "done"  # the stopped copy's slot ran the next lease
