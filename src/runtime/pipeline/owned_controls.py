"""The controls a run sends a node about its replicas, naming the run's process.

``spawn_worker`` and ``stop_worker`` carry ``owner_process`` (``process_identity``): the node
stops a run's replicas at once once that process is gone from its host, and a stop from another
process (a late one of an earlier run of the same pipeline) leaves the replica of the name alone.
A node of before the field refuses it as it refuses any field its spec does not allow, before it
does anything: the control is sent again without it, and that node is sent it no more. A
cluster's nodes and the runs on it are not upgraded at one instant.
"""

from __future__ import annotations

from typing import Any

import structlog

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import BadRequest
from troupe.runtime.process_identity import process_identity

__all__ = ["OWNER_PROCESS", "OwnedControls"]

log = structlog.get_logger(__name__)

OWNER_PROCESS = "owner_process"


class OwnedControls:
    """Sends a node controls that may name this run's process, minding the nodes that refuse it.

    Args:
        runtime: the run's runtime.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.identity = process_identity()  # "" where none can be told: then never sent
        self.older_nodes: set[str] = set()  # endpoints of nodes that refuse ``owner_process``

    def named(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` naming this run's process (as it is where none can be told)."""
        return {**payload, OWNER_PROCESS: self.identity} if self.identity else payload

    def for_node(self, endpoint: str, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` as the node at ``endpoint`` takes it: without ``owner_process`` for a node
        known to refuse it."""
        if endpoint in self.older_nodes:
            return {k: v for k, v in payload.items() if k != OWNER_PROCESS}
        return payload

    async def ask(self, endpoint: str, control: str, payload: dict[str, Any], timeout: float) -> Any:
        """``control`` with ``payload`` asked of the node at ``endpoint``; asked again without
        ``owner_process`` where the node refuses that field (and so from then on)."""
        payload = self.for_node(endpoint, payload)
        try:
            return await self.runtime.control(endpoint, control, payload, timeout=timeout)
        except BadRequest as exc:
            if OWNER_PROCESS not in payload or f"'{OWNER_PROCESS}'" not in str(exc):
                raise
        self.older_nodes.add(endpoint)
        log.info("node_without_owner_process", endpoint=endpoint, control=control)
        return await self.ask(endpoint, control, payload, timeout)
