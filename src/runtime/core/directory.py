"""Name resolution: from an actor address to the mailbox endpoint of its process.

Each runtime keeps a cache of ``node/process/actor -> endpoint`` (every actor has a mailbox
socket of its own) and ``node/process -> endpoint`` (the process's control mailbox). What it
does not know it asks a lookup function, normally a control ask to the node (``resolve``),
which knows every process of its host. The node pushes ``directory_update`` to its processes
when one (re)registers, so caches follow restarts without waiting for a timeout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from troupe.runtime.errors import UnknownActor

from .ref import ActorAddress

__all__ = ["Directory", "DirectoryStats", "Lookup"]

Lookup = Callable[[ActorAddress], Awaitable[tuple[ActorAddress, str]]]
"""Resolve a (possibly partial) address to its full address and process endpoint."""


@dataclass(frozen=True, slots=True)
class DirectoryStats:
    """Cache counters."""

    cached: int
    hits: int
    lookups: int
    invalidations: int


class Directory:
    """The resolution cache of one runtime.

    Args:
        node: this process's node name (fills in ``process/actor`` addresses).
        lookup: asked for what the cache does not hold; None means local names only.
    """

    def __init__(self, node: str, lookup: Lookup | None = None) -> None:
        self.node = node
        self.lookup = lookup
        # Added to a lookup's "no answer" (``live_lookup``): what else the silence may mean
        # (a CURVE client of a keyless node is answered by nothing; ``connect`` sets it).
        self.silence_hint = ""
        self._endpoints: dict[str, str] = {}
        self._hits = 0
        self._lookups = 0
        self._invalidations = 0

    def statistics(self) -> DirectoryStats:
        """Return counters."""
        return DirectoryStats(len(self._endpoints), self._hits, self._lookups, self._invalidations)

    def learn(self, process_key: str, endpoint: str) -> str | None:
        """Record where a process listens; return the endpoint it replaced, if different."""
        old = self._endpoints.get(process_key)
        self._endpoints[process_key] = endpoint
        return old if old != endpoint else None

    def forget(self, key: str) -> None:
        """Drop a cached endpoint (its process died or moved)."""
        if self._endpoints.pop(key, None) is not None:
            self._invalidations += 1

    def forget_process(self, process_key: str) -> list[str]:
        """Drop the process and every actor of it; return the endpoints dropped."""
        prefix = process_key + "/"
        keys = [k for k in self._endpoints if k == process_key or k.startswith(prefix)]
        dropped = [self._endpoints.pop(k) for k in keys]
        self._invalidations += len(keys)
        return dropped

    def cached(self, process_key: str) -> str | None:
        """Return the cached endpoint of a process, if any."""
        return self._endpoints.get(process_key)

    def known(self, address: ActorAddress) -> tuple[ActorAddress, str] | None:
        """The full address and endpoint of ``address`` where the cache has them (no lookup)."""
        if not address.process:
            return None
        full = address if address.node else ActorAddress(self.node, address.process, address.actor)
        endpoint = self._endpoints.get(str(full))
        if endpoint is None:
            return None
        self._hits += 1
        return full, endpoint

    async def resolve(self, address: ActorAddress) -> tuple[ActorAddress, str]:
        """Return the full address and the endpoint of its process.

        Raises:
            UnknownActor: nobody knows the name.
        """
        hit = self.known(address)
        if hit is not None:
            return hit
        if self.lookup is None:
            raise UnknownActor(f"cannot resolve {address}: no directory to ask")
        self._lookups += 1
        full, endpoint = await self.lookup(address)
        self._endpoints[str(full)] = endpoint
        return full, endpoint
