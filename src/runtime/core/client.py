"""A runtime for programs that are not workers: the CLI, tests, a trainer's driver script.

``connect`` gives a runtime with no actors of its own whose names resolve through a node, so a
plain script can ``ask`` any actor of the cluster.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .directory import Directory
from .ref import ActorAddress
from .runtime import Runtime, process_runtime

__all__ = ["connect"]


@asynccontextmanager
async def connect(node_endpoint: str, node: str = "", name: str | None = None) -> AsyncIterator[Runtime]:
    """Open a client runtime that resolves names through the node at ``node_endpoint``.

    Args:
        node_endpoint: the node's control endpoint.
        node: the node's name, when known (fills in ``process/actor`` addresses).
        name: this client's process name (default ``client-<pid>``).
    """
    box: list[Runtime] = []

    async def lookup(address: ActorAddress) -> tuple[ActorAddress, str]:
        reply = await box[0].control(node_endpoint, "resolve", {"address": str(address)})
        return ActorAddress.parse(reply["address"]), reply["endpoint"]

    runtime = process_runtime(
        node or "client",
        name or f"client-{os.getpid()}",
        directory=Directory(node, lookup),
        drain_timeout=0.5,
    )
    box.append(runtime)
    async with runtime:
        yield runtime
