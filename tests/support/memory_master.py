"""A master in memory, with a client runtime and workers that call it (TaskGetters on MemoryHub)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.getter_start import install_task_control
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.transports.base import MemoryHub

__all__ = ["MASTER", "Master1", "Runner", "master_in_memory", "until"]

MASTER = "mem://master"
Runner = Callable[[LeasedTask], Awaitable[str | None]]


async def until(condition: Callable[[], Any], timeout: float = 15.0) -> None:
    """A bounded poll of a condition, yielding to the loop between looks."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.001)


class Master1:
    """A master in memory and a client runtime to call it."""

    def __init__(self, hub: MemoryHub, master: Master, client: Runtime) -> None:
        self.hub, self.master, self.client = hub, master, client
        self.getters: dict[str, TaskGetter] = {}

    async def call(self, msg_type: str, payload: Any = None, timeout: float = 10.0) -> Any:
        return await self.client.control(MASTER, msg_type, payload, timeout=timeout)

    async def submit(self, name: str, count: int, **job: Any) -> None:
        await self.call(
            "submit", {"job": {"job": {"name": name, "kind": "k", "count": count, **job}}, "source": "t"}
        )

    async def held(self, worker_id: str) -> int:
        workers = (await self.call("status"))["workers"]
        return next(int(w["used"]) for w in workers if w["worker_id"] == worker_id)

    @asynccontextmanager
    async def worker(self, name: str, runner: Runner, **cfg: Any) -> AsyncIterator[TaskGetter]:
        """One worker ``n1/<name>`` in its own runtime (its process); gone when the block ends."""
        async with Runtime("n1", name, self.hub.transport()) as rt:
            install_task_control(rt, self.getters)
            options = {"wait_s": 0.3, "call_timeout_s": 2.0, "retry_s": 0.02, **cfg}
            getter = TaskGetter(rt, MASTER, GetterConfig(f"n1/{name}", "n1", **options), runner)
            self.getters[getter.worker_id] = getter
            async with anyio.create_task_group() as tg:
                tg.start_soon(getter.run)
                await until(lambda: getter.worker_id in self.master.workers())
                yield getter
                tg.cancel_scope.cancel()


@asynccontextmanager
async def master_in_memory(
    tmp_path: Path,
    wall_clock: Callable[[], float] = time.time,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[Master1]:
    """A master on ``tmp_path / "journal.db"`` (new, or the one there: a restart), on the
    clocks given (a test's fakes: see ``Master``)."""
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    transport = hub.transport(name="master")
    master = Master(
        MasterConfig(tick_s=0.01), journal, book, transport=transport, clock=clock, wall_clock=wall_clock
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(master.run)
            await master.ready.wait()
            async with Runtime("client", "client", hub.transport()) as client:
                yield Master1(hub, master, client)
                master.stop()
                tg.cancel_scope.cancel()
    finally:
        journal.close()
