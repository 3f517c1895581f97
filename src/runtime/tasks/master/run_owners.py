"""The runs a master hears from, for the nodes that host their replicas.

A node stops the replicas of a run that is gone (``node/spawn_owners.py``): a ``troupe run``
killed with SIGKILL, or cut off with its host, cannot stop them itself, and its rerun could not
start replicas of the same names. A node learns that by pinging the run, which works where the
run listens where the node reaches it: a run on the node's own loopback. A cluster run's
process listens on its own loopback only, so a node on another host (every node of a real
cluster) could not tell, and such replicas ran for good. Every run reaches the master, though:
it beats to it (``owner_beat {owner}``) every few seconds while its replicas run, and a node
asks the master how long the run has been silent (``owner_seen {owner}``: ``silent_s``).

An owner the master has not heard from since it started (it restarted, or the run never beat)
counts as silent since the master started: a run that lives beats again within seconds. Owners
silent an hour are forgotten, and at most ``MOST`` are kept (the longest silent go first).

A rerun that finds the run killed on its own host (its process is gone: ``process_identity``)
says so (``owner_gone {owner}``): the owner counts as silent for ``FORGET_AFTER_S`` at once, so
the nodes free its replicas' names for the rerun without waiting out the silence. A beat from
it after that (it was not gone after all) counts as ever.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["MOST", "RunOwners"]

MOST = 10_000
FORGET_AFTER_S = 3600.0


class RunOwners:
    """When the master last heard from each run that owns replicas on the nodes.

    Args:
        clock: seconds, monotonic (a test's fake).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        self._heard: dict[str, float] = {}
        self._gone: dict[str, None] = {}  # owners known gone (``gone``), oldest first

    def beat(self, owner: str) -> None:
        """``owner`` is there now."""
        now = self._clock()
        self._gone.pop(owner, None)  # it was not gone after all
        self._heard.pop(owner, None)  # re-inserted last: the dict stays in order of last beat
        self._heard[owner] = now
        while self._heard:  # in order of last beat: the oldest first
            oldest = next(iter(self._heard))
            if len(self._heard) <= MOST and now - self._heard[oldest] <= FORGET_AFTER_S:
                break
            del self._heard[oldest]

    def gone(self, owner: str) -> None:
        """``owner`` is known to be gone: silent for ``FORGET_AFTER_S`` from now on, until it beats."""
        self._heard.pop(owner, None)
        self._gone[owner] = None
        while len(self._gone) > MOST:
            del self._gone[next(iter(self._gone))]

    def silent_s(self, owner: str) -> float:
        """Seconds since ``owner`` last beat (since the master started, if it has not)."""
        if owner in self._gone:
            return FORGET_AFTER_S
        return self._clock() - self._heard.get(owner, self._started)

    def heard(self, owner: str) -> bool:
        """Whether ``owner`` beat since the master started (and is not forgotten)."""
        return owner in self._heard
