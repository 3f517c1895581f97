"""What the master knows about nodes: where they listen, their resources, whether alive.

:class:`NodeTable` is the master's node directory: the endpoint and resources each node last
reported, and whether it is alive. A node is alive from its first beat until it stays silent
for ``timeout_s``; :meth:`NodeTable.expired` (called on the master's clock tick, with ``now``
passed in) names the nodes that just died, once each. A dead node that beats again is alive
again; its workers register anew when the master answers them ``unknown_worker``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["NodeInfo", "NodeTable"]


@dataclass(slots=True)
class NodeInfo:
    """One node as the master last heard of it."""

    node: str
    endpoint: str
    first_seen: float
    last_beat: float
    alive: bool = True
    resources: dict[str, Any] = field(default_factory=dict)


class NodeTable:
    """Nodes that beat to the master, and which of them went silent.

    Args:
        timeout_s: a node silent this long is dead.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._nodes: dict[str, NodeInfo] = {}

    def beat(self, node: str, endpoint: str, resources: dict[str, Any], now: float) -> bool:
        """Record a beat; return True when the node is new or was dead."""
        info = self._nodes.get(node)
        if info is None:
            self._nodes[node] = NodeInfo(node, endpoint, now, now, True, resources)
            return True
        revived = not info.alive
        info.endpoint, info.last_beat, info.alive = endpoint or info.endpoint, now, True
        if resources:
            info.resources = resources
        return revived

    def expired(self, now: float) -> list[str]:
        """Mark dead, and return, the alive nodes silent for longer than ``timeout_s``."""
        dead = [n.node for n in self._nodes.values() if n.alive and now - n.last_beat > self.timeout_s]
        for node in dead:
            self._nodes[node].alive = False
        return dead

    def mark_dead(self, node: str) -> None:
        """Declare a node dead now (an operator or its supervisor said so)."""
        info = self._nodes.get(node)
        if info is not None:
            info.alive = False

    def endpoint(self, node: str) -> str | None:
        """Return the node's control endpoint, or None if it never beat."""
        info = self._nodes.get(node)
        return info.endpoint if info is not None else None

    def nodes(self) -> list[NodeInfo]:
        """Return every node ever seen, by name."""
        return [self._nodes[n] for n in sorted(self._nodes)]
