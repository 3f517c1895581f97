"""Drive a MasterSource as the engine does: run it, take ``n`` items, settle each ``ok``."""

from __future__ import annotations

from typing import Any

import anyio

from troupe.runtime.pipeline.source import MasterSource

__all__ = ["RuntimeControls", "take_and_settle"]


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
