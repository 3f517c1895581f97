"""Per-peer limits that keep one hostile or broken peer from costing the others: a token bucket
per peer (how many bad frames a peer may send, answered, before core/throttle.py throttles it)
and a once-per-interval gate for log lines about a peer (so a flood makes one line, not
thousands).

Both remember a bounded number of peers: the least recently seen is forgotten first, so a peer
that reconnects again and again (a new ZeroMQ identity each time) cannot grow them without
bound. Both are used from the event loop thread only and read no clock but the one given.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

__all__ = ["PeerLogGate", "PeerRateLimiter"]

Clock = Callable[[], float]


class PeerRateLimiter:
    """A token bucket per peer: ``burst`` at once, then ``rate_per_s`` on average.

    Args:
        rate_per_s: tokens a peer earns per second.
        burst: the most tokens a peer can hold (and the allowance of a new peer).
        max_peers: peers remembered at once; beyond it the least recently seen is forgotten.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self, rate_per_s: float, burst: int, max_peers: int = 1024, clock: Clock = time.monotonic
    ) -> None:
        if not rate_per_s > 0 or burst < 1 or max_peers < 1:
            raise ValueError(
                f"rate_per_s must be > 0, burst and max_peers >= 1; got {rate_per_s!r}, {burst!r}, "
                f"{max_peers!r}"
            )
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst)
        self.max_peers = max_peers
        self._clock = clock
        self._buckets: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()  # peer -> (tokens, at)
        self.allowed = 0
        self.refused = 0

    def allow(self, peer: Hashable) -> bool:
        """Take one token of ``peer``'s; False (and counted as refused) when it has none."""
        now = self._clock()
        buckets = self._buckets
        entry = buckets.pop(peer, None)
        if entry is None:
            tokens = self.burst
            if len(buckets) >= self.max_peers:
                buckets.popitem(last=False)
        else:
            tokens = min(self.burst, entry[0] + (now - entry[1]) * self.rate_per_s)
        ok = tokens >= 1.0
        if ok:
            tokens -= 1.0
            self.allowed += 1
        else:
            self.refused += 1
        buckets[peer] = (tokens, now)
        return ok

    def __len__(self) -> int:
        return len(self._buckets)


class PeerLogGate:
    """Says whether to log about a peer now: at most once per ``interval_s`` per peer.

    Args:
        interval_s: the least time between two lines about one peer.
        max_peers: peers remembered at once; beyond it the least recently logged is forgotten.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self, interval_s: float = 10.0, max_peers: int = 1024, clock: Clock = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self.max_peers = max_peers
        self._clock = clock
        self._last: OrderedDict[Hashable, float] = OrderedDict()
        # Events about each peer not logged since its last line, told with its next line.
        self._quiet: dict[Hashable, int] = {}

    def should_log(self, peer: Hashable) -> bool:
        """True when nothing was logged about ``peer`` within the interval; the caller logs."""
        now = self._clock()
        last = self._last.get(peer)
        if last is not None and now - last < self.interval_s:
            self._quiet[peer] = self._quiet.get(peer, 0) + 1
            return False
        self._last.pop(peer, None)
        if len(self._last) >= self.max_peers:
            old, _ = self._last.popitem(last=False)
            self._quiet.pop(old, None)
        self._last[peer] = now
        return True

    def take_quiet(self, peer: Hashable) -> int:
        """How many events about ``peer`` went unlogged since its previous line (then reset)."""
        return self._quiet.pop(peer, 0)
