"""Which encoder actor a rank sends each sample group to: the round robin from an offset given
by the rank, over the actors that are not backed off after a failure, and the probe that takes
one back (how long it waits: :func:`probe_wait_s`). See :mod:`.inflight`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from .inflight_types import InflightConfig

__all__ = ["PROBE_ANSWERS", "PROBE_FACTOR", "PROBE_MIN_S", "Dispatch", "RoundRobin", "probe_wait_s"]


class RoundRobin:
    """Actor indices ``(rank + i) % n`` for i = 0, 1, ...: each rank starts at its own offset."""

    def __init__(self, n_actors: int, rank: int) -> None:
        if n_actors < 1:
            raise ValueError(f"n_actors={n_actors!r}: expected at least one encoder actor")
        self.n_actors = n_actors
        self._next = rank % n_actors

    def __next__(self) -> int:
        index = self._next
        self._next = (index + 1) % self.n_actors
        return index

    def __iter__(self) -> Iterator[int]:
        return self


@dataclass
class _Health:
    """One actor as a rank sees it: healthy (``backoff == 0``), or passed over until ``until``."""

    backoff: float = 0.0
    until: float = 0.0
    probing: bool = False
    """A probe is out: no other group goes to the actor before its answer."""


class Dispatch:
    """The rank's round robin (:class:`RoundRobin`'s order) over the actors that are not backed
    off, and their health (see the module)."""

    def __init__(
        self, n_actors: int, config: InflightConfig, clock: Callable[[], float], skipped: list[int]
    ) -> None:
        if n_actors < 1:
            raise ValueError(f"n_actors={n_actors!r}: expected at least one encoder actor")
        self.n_actors = n_actors
        self.config = config
        self.clock = clock
        self.skipped = skipped
        self.health = [_Health() for _ in range(n_actors)]
        self._next = config.rank % n_actors

    def _open(self, actor: int, now: float) -> bool:
        h = self.health[actor]
        return h.backoff == 0 or (now >= h.until and not h.probing)

    def pick(self, tried: Collection[int] = ()) -> tuple[int, bool]:
        """The next actor for a group that ``tried`` already failed, and whether the ask probes
        it. Actors passed over because they are backed off count as ``skipped``."""
        now = self.clock()
        n = self.n_actors
        order = [(self._next + i) % n for i in range(n) if (self._next + i) % n not in tried]
        if not order:
            raise ValueError("pick: every actor was tried")
        chosen = next((a for a in order if self._open(a, now)), None)
        if chosen is None:  # every actor left is backed off: the one free soonest, probes last
            chosen = min(order, key=lambda a: (self.health[a].probing, self.health[a].until))
        for actor in order[: order.index(chosen)]:
            self.skipped[actor] += 1
        self._next = (chosen + 1) % n
        h = self.health[chosen]
        probe = h.backoff > 0 and not h.probing
        h.probing = h.probing or probe
        return chosen, probe

    def succeeded(self, actor: int) -> None:
        self.health[actor] = _Health()

    def failed(self, actor: int, probe: bool) -> None:
        h = self.health[actor]
        if probe:
            h.probing = False
            h.backoff = min(max(2 * h.backoff, self.config.retry_after_s), self.config.retry_after_max_s)
        elif h.backoff == 0:
            h.backoff = self.config.retry_after_s
        else:
            return  # an ask sent before the actor was known to fail: its back-off already runs
        h.until = self.clock() + h.backoff


PROBE_ANSWERS = 32
"""The recent answered asks whose slowest sets a probe's wait."""
PROBE_FACTOR = 4.0
PROBE_MIN_S = 1.0


def probe_wait_s(config: InflightConfig, answered: Collection[float]) -> float:
    """Seconds a probe waits: ``config.probe_deadline_s`` where set; else ``PROBE_FACTOR`` times
    the slowest of ``answered`` (the rank's last ``PROBE_ANSWERS`` answered asks, in seconds), at
    least ``PROBE_MIN_S``; never more than ``deadline_s``, which is the wait before any answer."""
    if config.probe_deadline_s is not None:
        return min(config.probe_deadline_s, config.deadline_s)
    if not answered:
        return config.deadline_s
    return min(config.deadline_s, max(PROBE_MIN_S, PROBE_FACTOR * max(answered)))
