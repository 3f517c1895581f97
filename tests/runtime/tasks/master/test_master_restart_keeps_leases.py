"""A master restarted mid-task leaves the running copies running (report mt 6).

A real master and real getters over the in-memory transport: the master stops while every
worker runs a task, another starts on its journal. Before, it voided the leases, refused their
renewals, and each task was cancelled and run again from zero. Now each getter's next renew (its
old lease ids) is accepted, its answer has the getter register again though it is busy, and
every task runs once. A worker that renewed, and died before it registered again, has its
leases back at once by its node's word (``worker_left``, ``node_dead``), not a lease later.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.memory_master import master_in_memory
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.getter_start import install_task_control
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.state import TaskState
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"


async def until(condition: Callable[[], Any]) -> None:
    """A bounded poll of a condition, yielding to the loop between looks."""
    with anyio.fail_after(20):
        while not condition():
            await anyio.sleep(0.005)


async def test_a_restarted_master_keeps_its_workers_running_copies_and_runs_none_again(
    tmp_path: Path,
) -> None:
    starts: Counter[str] = Counter()
    gate = anyio.Event()

    async def run(task: LeasedTask) -> str:
        starts[task.task_id] += 1
        await gate.wait()
        return f"out/{task.task_id}"

    hub = MemoryHub()
    path = tmp_path / "journal.db"
    journal, book = open_journal(path, new=True)
    first = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    getters: dict[str, TaskGetter] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.run)
        await first.ready.wait()
        async with (
            Runtime("client", "client", hub.transport()) as client,
            Runtime("n1", "w", hub.transport()) as rt,
        ):
            install_task_control(rt, getters)
            for i in range(2):
                config = GetterConfig(f"n1/w{i}", "n1", wait_s=0.3, call_timeout_s=1.0, retry_s=0.02)
                getters[config.worker_id] = TaskGetter(rt, MASTER, config, run)
                rt.start_soon(getters[config.worker_id].run)
            job = {"job": {"name": "m", "kind": "k", "count": 2, "lease_s": 1.5}}
            await client.control(MASTER, "submit", {"job": job, "source": "test"})
            await until(lambda: len(starts) == 2)  # each worker runs one, its slot taken
            first.stop()
            await until(lambda: not hub.transports.get(MASTER))
            journal.close()
            journal, book = open_journal(path)
            second = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
            tg.start_soon(second.run)
            await second.ready.wait()

            async def holders() -> list[int]:
                status = await client.control(MASTER, "status")
                return sorted(w["used"] for w in status["workers"])

            # Both renewed their leases and registered again, busy as they are.
            with anyio.fail_after(20):
                while await holders() != [1, 1]:
                    await anyio.sleep(0.05)
            gate.set()
            view = await client.control(MASTER, "wait_job", {"job_id": "m", "timeout_s": 20}, timeout=25)
            status = await client.control(MASTER, "status")
            second.stop()
            tg.cancel_scope.cancel()
    journal.close()
    assert view["state"] == "done" and view["counts"]["done"] == 2, view
    assert starts == {"m-000000": 1, "m-000001": 1}  # none run again
    assert not status["stale_reports"], status["stale_reports"]  # no renewal refused
    assert all(g.statistics().cancelled == 0 for g in getters.values())


@pytest.mark.parametrize("death", ["worker_left", "node_dead"])
async def test_a_holder_that_dies_before_it_registers_again_gives_its_lease_back_at_once(
    tmp_path: Path, death: str
) -> None:
    async with master_in_memory(tmp_path) as m:
        await m.submit("j", 1, lease_s=600)
        registration = {"worker_id": "n1/w0", "node": "n1", "endpoint": "mem://w0", "slots": 1}
        await m.call("register_worker", registration)
        request = {"worker_id": "n1/w0", "free_slots": 1, "wait_s": 0}
        (lease,) = (await m.call("request_task", request))["leases"]
    async with master_in_memory(tmp_path) as m:  # a restart on the journal
        ids = {"worker_id": "n1/w0", "task_id": lease["task_id"], "lease_id": lease["lease_id"]}
        renewed = await m.call("renew", {**ids, "node": "n1"})
        assert (renewed["outcome"], renewed["known"]) == ("renewed", False)
        # it dies before it registers again: its node says so
        if death == "worker_left":
            assert await m.call("worker_left", {"worker_id": "n1/w0", "pid": 7, "reason": "exit -9"}) is True
        else:
            assert await m.call("node_dead", {"node": "n1"}) is True
        info = m.master.book.task(lease["task_id"])
        assert (info.state, info.attempts) == (TaskState.PENDING, 1)
        # and a worker nobody knows is still refused
        assert await m.call("worker_left", {"worker_id": "n1/w9", "reason": "exit"}) is False


REGISTRATION = {"worker_id": "n1/w0", "node": "n1", "endpoint": "mem://w0", "slots": 1, "pid": 100}
REQUEST = {"worker_id": "n1/w0", "free_slots": 1, "wait_s": 0}


async def leased_before_a_restart(tmp_path: Path, **job: Any) -> dict[str, Any]:
    """A job of one task leased to n1/w0 (pid 100) by a master that then stops: its lease."""
    async with master_in_memory(tmp_path) as m:
        await m.submit("j", 1, lease_s=600, **job)
        await m.call("register_worker", REGISTRATION)
        (lease,) = (await m.call("request_task", REQUEST))["leases"]
    return dict(lease)


async def test_a_new_process_of_a_holders_name_that_registers_first_gives_its_lease_back_at_once(
    tmp_path: Path,
) -> None:
    """lo 2: the holder renewed (pid 100) and died; its node started another process of its
    name (pid 200), which registered before the node's worker_left for the dead one. It inherited
    the lease it never ran, and the task waited out ``lease_s``; the late worker_left, of an older
    pid, was stale. Now the registration puts the lease back at once, an attempt lost."""
    lease = await leased_before_a_restart(tmp_path)
    async with master_in_memory(tmp_path) as m:  # a restart on the journal
        ids = {"worker_id": "n1/w0", "task_id": lease["task_id"], "lease_id": lease["lease_id"]}
        renewed = await m.call("renew", {**ids, "node": "n1", "pid": 100})
        assert (renewed["outcome"], renewed["known"]) == ("renewed", False)
        await m.call("register_worker", {**REGISTRATION, "pid": 200})  # pid 100 died meanwhile
        info = m.master.book.task(lease["task_id"])
        assert (info.state, info.attempts) == (TaskState.PENDING, 1)
        assert await m.call("worker_left", {"worker_id": "n1/w0", "pid": 100, "reason": "exit -9"}) is False
        (again,) = (await m.call("request_task", REQUEST))["leases"]
        assert again["task_id"] == lease["task_id"] and again["lease_id"] > lease["lease_id"]


@pytest.mark.parametrize(("pid", "kept"), [(100, True), (200, False)])
async def test_a_busy_worker_that_sends_its_registration_again_keeps_its_lease(
    tmp_path: Path, pid: int, kept: bool
) -> None:
    """jx 6: after a restart a busy worker renewed its lease and registered; the registration
    waited behind a slow batch past the getter's call_timeout_s and was sent again once answered.
    The master took the second for the worker leaving and joining again: the running task was
    put back, an attempt lost (dead-lettered on its last), its renewal refused. The same process
    registering again keeps its lease now; another process of its name still takes its place."""
    lease = await leased_before_a_restart(tmp_path, max_attempts=1)
    async with master_in_memory(tmp_path) as m:  # a restart on the journal
        ids = {"worker_id": "n1/w0", "task_id": lease["task_id"], "lease_id": lease["lease_id"]}
        renewed = await m.call("renew", {**ids, "node": "n1", "pid": 100})
        assert (renewed["outcome"], renewed["known"]) == ("renewed", False)
        await m.call("register_worker", REGISTRATION)  # answered after the worker gave up waiting
        await m.call("register_worker", {**REGISTRATION, "pid": pid})  # sent again
        info = m.master.book.task(lease["task_id"])
        renewed = await m.call("renew", {**ids, "node": "n1", "pid": pid})
        if kept:
            assert (info.state, info.attempts) == (TaskState.LEASED, 0)
            assert renewed["outcome"] == "renewed"
        else:
            assert (info.state, info.attempts) == (TaskState.DEAD, 1)
            assert info.error == "worker n1/w0 on node n1 left: rejoined"
            assert renewed["outcome"] == "rejected"


async def test_a_worker_left_of_another_pid_leaves_a_claimants_lease_alone(tmp_path: Path) -> None:
    """sm 2: after a restart the holder (pid 100) renewed its lease and had not registered yet
    when its node's worker_left for an older process of its name (pid 50, which died while the
    master was down) came: the master took it, and the running copy's task went back, an attempt
    lost. A worker_left naming a pid now puts back only that process's leases."""
    lease = await leased_before_a_restart(tmp_path)
    async with master_in_memory(tmp_path) as m:  # a restart on the journal
        ids = {"worker_id": "n1/w0", "task_id": lease["task_id"], "lease_id": lease["lease_id"]}
        renewed = await m.call("renew", {**ids, "node": "n1", "pid": 100})
        assert (renewed["outcome"], renewed["known"]) == ("renewed", False)
        assert await m.call("worker_left", {"worker_id": "n1/w0", "pid": 50, "reason": "exit -9"}) is False
        info = m.master.book.task(lease["task_id"])
        assert (info.state, info.attempts) == (TaskState.LEASED, 0)
        assert (await m.call("renew", {**ids, "node": "n1", "pid": 100}))["outcome"] == "renewed"
        assert (await m.call("status"))["stale_reports"] == {"worker_left_stale": 1}
        # its own death still gives it back at once
        assert await m.call("worker_left", {"worker_id": "n1/w0", "pid": 100, "reason": "exit -9"}) is True
        info = m.master.book.task(lease["task_id"])
        assert (info.state, info.attempts) == (TaskState.PENDING, 1)
