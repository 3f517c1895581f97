"""Two reports a restarted master answers with ``known: false`` make the worker register once."""

from __future__ import annotations

from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.task_actor import LeasedTask, TaskActor
from troupe.runtime.tasks.task_runner import ActorRunner
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"


class Quick(TaskActor):
    task_kinds = ("quick",)

    async def run_task(self, task: LeasedTask) -> str | None:
        return f"out://{task.task_id}"


class ForgettingMaster:
    """Leases two tasks at once, then answers both reports ``known: false``: the first at once
    (both in), the second only after the worker registered again, so it is older than that."""

    def __init__(self, rt: Runtime) -> None:
        self.registrations = 0
        self.leased = False
        self._reports: list[anyio.Event] = []
        self._both_in = anyio.Event()
        self._registered_again = anyio.Event()
        rt.register_controls(
            {
                "register_worker": self._register,
                "request_task": self._request,
                "renew": self._renew,
                "complete": self._complete,
            }
        )

    async def _register(self, _: Any) -> dict[str, Any]:
        self.registrations += 1
        if self.registrations == 2:
            self._registered_again.set()
        return {"ok": True}

    async def _request(self, p: Any) -> dict[str, Any]:
        if self.leased:
            await anyio.sleep(min(float(p["wait_s"]), 0.05))  # the long poll, kept short
            return {"leases": []}
        self.leased = True
        return {"leases": [self._lease(f"t-{i}", i + 1) for i in range(2)]}

    @staticmethod
    def _lease(task_id: str, lease_id: int) -> dict[str, Any]:
        return {"task_id": task_id, "lease_id": lease_id, "job_id": "j", "kind": "quick", "seed": 1,
                "refs": {}, "attempt": 1, "backup": False, "ttl": 30.0}  # fmt: skip

    async def _renew(self, _: Any) -> dict[str, Any]:
        return {"outcome": "renewed", "ttl": 30.0}

    async def _complete(self, _: Any) -> dict[str, Any]:
        first = not self._reports
        self._reports.append(anyio.Event())
        if first:
            await self._both_in.wait()
        else:
            self._both_in.set()
            await self._registered_again.wait()
        return {"outcome": "ok", "leases": [], "known": False}


async def test_an_answer_older_than_the_last_registration_registers_no_more() -> None:
    hub = MemoryHub()
    async with (
        Runtime("m", "master", hub.transport(name="master")) as master_rt,
        Runtime("n", "w", hub.transport()) as rt,
    ):
        master = ForgettingMaster(master_rt)
        actor = Quick()
        await rt.spawn(actor, "task")
        config = GetterConfig("n/w", "n", slots=2, wait_s=0.05, retry_s=0.01)
        getter = TaskGetter(rt, MASTER, config, ActorRunner([actor]))
        async with anyio.create_task_group() as tg:
            tg.start_soon(getter.run)
            with anyio.fail_after(30):
                while getter.statistics().completed < 2:
                    await anyio.sleep(0.001)
            # The second answer was handled in the same step that counted it: had it asked for
            # a registration, the getter would be unregistered now.
            assert getter._registered
            tg.cancel_scope.cancel()
    assert master.registrations == 2
