"""A real node in the test's own process, stopped (workers and template reaped) on the way out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from troupe.runtime.node.config import NodeConfig
from troupe.runtime.node.local import start_local_node
from troupe.runtime.node.node import Node

__all__ = ["running_node"]

STOP_WITHIN_S = 60.0  # a bound on the stop's grace and reaping, not on speed


@asynccontextmanager
async def running_node(cfg: NodeConfig) -> AsyncIterator[Node]:
    """The node of ``cfg``, started and ready; stopped when the block ends, however it ends."""
    async with anyio.create_task_group() as tg:
        node = await start_local_node(tg, cfg)
        try:
            yield node
        finally:
            node.stopping.set()
            with anyio.fail_after(STOP_WITHIN_S):
                await node.stopped.wait()
