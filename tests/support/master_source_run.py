"""Drive a MasterSource as the engine does: run it, take ``n`` items, settle each ``ok``."""

from __future__ import annotations

from typing import Any

import anyio

from troupe.runtime.pipeline.source import MasterSource

__all__ = ["JobMaster", "RuntimeControls", "take_and_settle"]


class RuntimeControls:
    """The control handlers of a fake runtime: a MasterSource registers ``cancel_lease`` on
    the runtime it is given while it runs, and unregisters it after."""

    def __init__(self) -> None:
        self.control_handlers: dict[str, Any] = {}

    def register_control(self, name: str, handler: Any) -> None:
        assert name not in self.control_handlers, f"{name} registered twice"
        self.control_handlers[name] = handler

    def unregister_control(self, name: str) -> Any:
        return self.control_handlers.pop(name)


async def take_and_settle(source: MasterSource, n: int, timeout: float = 20.0) -> None:
    """Until the source's run ends on its own (its job is over), within ``timeout``."""
    with anyio.fail_after(timeout):
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, lambda: None)
            items: list[Any] = []
            while len(items) < n:
                await anyio.sleep(0.01)  # a bounded poll: the whole of it is under fail_after
                items += source.take(n)
            for item in items:
                source.settle(item.task_id, "ok")


class JobMaster(RuntimeControls):
    """Answers a MasterSource's control calls as a master with one job of ``tasks`` tasks: a
    request for more once none is left is held as long as it asks (``wait_s``), as a master
    with no task to lease holds it, and ``held`` is set meanwhile."""

    node = "n"
    address = "tcp://127.0.0.1:1"

    def __init__(self, tasks: int, ttl: float = 60.0) -> None:
        super().__init__()
        self.todo = [
            {"task_id": f"t{i}", "lease_id": i + 1, "seed": i, "attempt": 1, "ttl": ttl} for i in range(tasks)
        ]
        self.completed: list[str] = []
        self.tasks = tasks
        self.held = anyio.Event()

    async def control(self, master: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        if msg_type == "request_task":
            if not self.todo:
                self.held.set()
                await anyio.sleep(float(payload["wait_s"]))
                return {"leases": []}
            granted, self.todo = self.todo[: payload["free_slots"]], self.todo[payload["free_slots"] :]
            return {"leases": granted}
        if msg_type == "complete":
            self.completed.append(payload["task_id"])
            return {"outcome": "completed"}
        if msg_type == "wait_job":
            return {"state": "done" if len(self.completed) == self.tasks else "running"}
        if msg_type == "dead":
            return []
        return {}
