"""Tasks under supervision and fault injection: busy status and before-handle hooks (in memory)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from troupe.runtime.chaos.faults import FaultPlan
from troupe.runtime.chaos.worker_side import WorkerChaos
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import FaultInjected
from troupe.runtime.supervision.status import WorkerState
from troupe.runtime.supervision.worker_health import WorkerHealth
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.task_actor import LeasedTask, TaskActor
from troupe.runtime.tasks.task_runner import ActorRunner
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"


class Probe(TaskActor):
    """Records what the worker's status said while each task ran."""

    task_kinds = ("probe",)

    def __init__(self) -> None:
        self.health: WorkerHealth | None = None
        self.seen: list[tuple[str, str | None]] = []

    async def run_task(self, task: LeasedTask) -> str | None:
        assert self.health is not None
        snap = self.health.status.snapshot()
        self.seen.append((snap.state.value, snap.current))
        return f"out://{task.task_id}"


async def _probe(rt: Runtime) -> tuple[Probe, WorkerHealth]:
    actor = Probe()
    await rt.spawn(actor, "task")
    health = WorkerHealth(rt, "w", None, 0.1)  # no supervisor address: the record, no beats
    actor.health = health
    return actor, health


async def test_a_running_task_shows_the_worker_busy_with_actor_and_kind() -> None:
    """While a task runs the status record is busy with ACTOR/KIND, and idle once it ended."""
    hub = MemoryHub()
    async with Runtime("n", "w", hub.transport()) as rt:
        actor, health = await _probe(rt)
        before = health.status.snapshot().progress_mark
        assert await ActorRunner([actor])(LeasedTask("t-1", "j", "probe", 1)) == "out://t-1"
        after = health.status.snapshot()
    assert actor.seen == [("busy", "task/probe")]
    assert after.state is WorkerState.IDLE and after.progress_mark > before


@pytest.mark.parametrize(
    ("spec", "expected"),
    [({"kind": "crash"}, FaultInjected), ({"kind": "crash", "message_type": "other"}, None)],
)
async def test_an_injected_crash_fails_the_task_of_the_matching_kind(
    spec: dict[str, Any], expected: type[Exception] | None
) -> None:
    """A crash fault raises inside the task path when it matches the task kind, and only then."""
    hub = MemoryHub()
    async with Runtime("n", "w", hub.transport()) as rt:
        actor, health = await _probe(rt)
        WorkerChaos(rt).add(FaultPlan.from_dicts(spec))
        runner = ActorRunner([actor])
        if expected is None:
            assert await runner(LeasedTask("t-1", "j", "probe", 1)) == "out://t-1"
        else:
            with pytest.raises(expected):
                await runner(LeasedTask("t-1", "j", "probe", 1))
            assert actor.seen == []
        assert health.status.state is WorkerState.IDLE


async def test_a_slow_fault_delays_the_task() -> None:
    """A slow fault blocks before the task runs, for its seconds."""
    hub = MemoryHub()
    async with Runtime("n", "w", hub.transport()) as rt:
        actor, _ = await _probe(rt)
        WorkerChaos(rt).add(FaultPlan.from_dicts({"kind": "slow", "seconds": 0.05}))
        t0 = time.monotonic()
        await ActorRunner([actor])(LeasedTask("t-1", "j", "probe", 1))
        assert time.monotonic() - t0 >= 0.05


class FakeMaster:
    """Leases ``tasks`` one by one and records what the worker reports."""

    def __init__(self, rt: Runtime, tasks: list[str]) -> None:
        self.todo = list(tasks)
        self.reports: list[tuple[str, str]] = []
        rt.register_controls(
            {
                "register_worker": self._ok,
                "request_task": self._request,
                "renew": self._renew,
                "complete": self._complete,
                "fail": self._fail,
            }
        )

    def _lease(self, n: int) -> list[dict[str, Any]]:
        leases = []
        for _ in range(min(n, len(self.todo))):
            task_id = self.todo.pop(0)
            leases.append(
                {
                    "task_id": task_id,
                    "lease_id": len(self.todo) + 1,
                    "job_id": "j",
                    "kind": "probe",
                    "seed": 1,
                    "refs": {},
                    "attempt": 1,
                    "backup": False,
                    "ttl": 30.0,
                }
            )
        return leases

    async def _ok(self, _: Any) -> dict[str, Any]:
        return {"ok": True}

    async def _request(self, p: Any) -> dict[str, Any]:
        if not self.todo:
            await anyio.sleep(min(float(p["wait_s"]), 0.05))  # the long poll, kept short
        return {"leases": self._lease(int(p["free_slots"]))}

    async def _renew(self, _: Any) -> dict[str, Any]:
        return {"outcome": "renewed", "ttl": 30.0}

    async def _report(self, kind: str, p: Any) -> dict[str, Any]:
        self.reports.append((kind, str(p["task_id"])))
        return {"outcome": "ok", "leases": self._lease(int(p.get("request") or 0)), "known": True}

    async def _complete(self, p: Any) -> dict[str, Any]:
        return await self._report("complete", p)

    async def _fail(self, p: Any) -> dict[str, Any]:
        return await self._report("fail", p)


async def test_a_dropped_task_is_neither_run_nor_reported() -> None:
    """A drop fault loses the first task (no run, no report, counted cancelled); the next one completes."""
    hub = MemoryHub()
    async with (
        Runtime("m", "master", hub.transport(name="master")) as master_rt,
        Runtime("n", "w", hub.transport()) as rt,
    ):
        master = FakeMaster(master_rt, ["t-1", "t-2"])
        actor, _ = await _probe(rt)
        WorkerChaos(rt).add(FaultPlan.from_dicts({"kind": "drop", "count": 1}))
        getter = TaskGetter(
            rt, MASTER, GetterConfig("n/w", "n", wait_s=0.05, retry_s=0.01), ActorRunner([actor])
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(getter.run)
            with anyio.fail_after(30):  # a bounded poll: the getter counts once the reply is in
                while getter.statistics().completed < 1:
                    await anyio.sleep(0.001)
            tg.cancel_scope.cancel()
    assert master.reports == [("complete", "t-2")]
    assert len(actor.seen) == 1
    stats = getter.statistics()
    assert (stats.started, stats.completed, stats.cancelled) == (2, 1, 1)
