"""A node run inside the calling process (``troupe run``, ``troupe demo``, the benchmarks, the API)."""

from __future__ import annotations

import anyio
import anyio.abc

from troupe.runtime.node.config import NodeConfig
from troupe.runtime.node.node import Node
from troupe.runtime.node.template_link import TemplateLink

__all__ = ["start_local_node"]


async def start_local_node(
    tg: anyio.abc.TaskGroup,
    cfg: NodeConfig,
    timeout: float = 60.0,
    template: TemplateLink | None = None,
    endpoint_may_move: bool = False,
) -> Node:
    """Run a node inside this process and wait until all its workers have registered.

    The command owns the stop signals (``client.run_async``): cancelling the group stops the
    node gracefully, workers first. ``template``: one started already, for the node to fork
    its workers from (see :class:`Node`). ``endpoint_may_move``: see ``Node.endpoint_may_move``.
    """
    node = Node(cfg, handle_signals=False, template=template)
    node.endpoint_may_move = endpoint_may_move
    tg.start_soon(node.run)
    with anyio.fail_after(timeout):
        await node.ready.wait()
        for handle in list(node.workers.values()):
            await handle.ready_event.wait()
    return node
