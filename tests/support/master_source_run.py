"""Drive a MasterSource as the engine does: run it, take ``n`` items, settle each ``ok``."""

from __future__ import annotations

from typing import Any

import anyio

from troupe.runtime.pipeline.source import MasterSource

__all__ = ["take_and_settle"]


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
