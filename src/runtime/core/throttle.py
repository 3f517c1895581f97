"""The throttle of peers that send bad frames: past an allowance, a peer's messages are dropped
unread for a cooldown, so that junk costs the receiver a dictionary lookup instead of a decode,
an ERROR reply and a log line each (DESIGN.md, invariant 7).

A peer is one connection to a mailbox (its ZeroMQ route: the socket and the connection's
identity, with CURVE also the sender's User-Id), so good peers, even on the same host or
sharing the cluster's key, are never throttled with a bad one. (Keying on the User-Id alone
would let one broken worker silence every process that holds the cluster key; a peer that
reconnects to start afresh must still pass the CURVE handshake each time.) Each peer
has a token bucket of bad frames (peer_limits.PeerRateLimiter): ``burst`` at once,
``rate_per_s`` on average. A bad frame within it is answered (an ERROR) and logged; the first
beyond it throttles the peer for ``cooldown_s``. A peer that is throttled again soon after its
release (within its last cooldown) gets twice the cooldown, up to ``MAX_COOLDOWN_FACTOR`` times
the base; one that behaved for that long starts from the base again. (The bucket refills during
a cooldown: a released peer may send another burst, answered, before it is throttled again.)
While a peer is throttled one log line per ``log_interval_s`` says how many of its messages
were dropped.

Used from the event loop thread only; reads no clock but the one given.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from troupe.runtime.library_logging import get_logger

from .peer_limits import PeerRateLimiter

__all__ = [
    "DEFAULT_BAD_FRAMES_BURST",
    "DEFAULT_BAD_FRAMES_PER_S",
    "DEFAULT_THROTTLE_S",
    "MAX_COOLDOWN_FACTOR",
    "PeerThrottle",
    "describe_peer",
]

log = get_logger(__name__)

Clock = Callable[[], float]

DEFAULT_BAD_FRAMES_BURST = 20
DEFAULT_BAD_FRAMES_PER_S = 10.0
DEFAULT_THROTTLE_S = 10.0
MAX_COOLDOWN_FACTOR = 32  # a peer that never stops sending junk is dropped for 320 s at a time
LOG_INTERVAL_S = 10.0


@dataclass(slots=True)
class _Throttled:
    """A peer that was throttled: its cooldowns, and what was dropped of it."""

    until: float = 0.0  # throttled until then (monotonic seconds); 0: not throttled now
    cooldown: float = 0.0  # the cooldown of its last throttle
    released: float = float("-inf")  # when its last throttle ended
    dropped: int = 0  # messages dropped since its last log line
    logged: float = 0.0  # when its last log line was written


def describe_peer(peer: Hashable) -> str:
    """A peer as a log line names it: ``mailbox endpoint <- connection identity`` for a
    ZeroMQ route (`` (user)`` added with CURVE), the transport's address (or ``repr``)
    otherwise."""
    if isinstance(peer, tuple) and len(peer) in (2, 3) and isinstance(peer[1], bytes):
        mailbox = getattr(peer[0], "peer", peer[0])
        user = f" ({peer[2]})" if len(peer) == 3 else ""
        return f"{mailbox} <- {peer[1].hex()}{user}"
    return str(getattr(peer, "address", None) or repr(peer))


class PeerThrottle:
    """Counts bad frames per peer and throttles a peer past its allowance.

    Args:
        burst: bad frames a peer may send at once (and the allowance of a new peer).
        rate_per_s: bad frames a peer may send per second on average.
        cooldown_s: how long a peer's messages are dropped once it is throttled (the base).
        max_peers: peers remembered at once, in each of the allowance and the throttled table;
            beyond it the least recently seen is forgotten, so that a peer reconnecting again
            and again cannot grow them without bound.
        log_interval_s: the least time between two lines about one throttled peer.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        burst: int = DEFAULT_BAD_FRAMES_BURST,
        rate_per_s: float = DEFAULT_BAD_FRAMES_PER_S,
        cooldown_s: float = DEFAULT_THROTTLE_S,
        max_peers: int = 1024,
        log_interval_s: float = LOG_INTERVAL_S,
        clock: Clock = time.monotonic,
    ) -> None:
        if burst < 1 or not rate_per_s > 0 or not cooldown_s > 0 or max_peers < 1:
            raise ValueError(
                "bad_frames_burst and max_peers must be >= 1, bad_frames_per_s and throttle_s > 0; "
                f"got {burst!r}, {max_peers!r}, {rate_per_s!r}, {cooldown_s!r}"
            )
        self.burst = burst
        self.rate_per_s = float(rate_per_s)
        self.cooldown_s = float(cooldown_s)
        self.max_peers = max_peers
        self.log_interval_s = log_interval_s
        self._clock = clock
        self._allowance = PeerRateLimiter(rate_per_s, burst, max_peers, clock)
        self._throttled: OrderedDict[Hashable, _Throttled] = OrderedDict()
        # Peers throttled and not yet seen released: while 0, ``blocked`` need not be called.
        self.active = 0
        self.throttles = 0  # times a peer was throttled
        self.dropped = 0  # messages dropped unread from throttled peers

    def blocked(self, peer: Hashable) -> bool:
        """True when ``peer`` is throttled: drop its message unread (it is counted and, once
        per interval, logged). Cheap; callers skip it while ``active`` is 0."""
        st = self._throttled.get(peer)
        if st is None or not st.until:
            return False
        now = self._clock()
        if now >= st.until:
            self._release(peer, st, now)
            return False
        st.dropped += 1
        self.dropped += 1
        if now - st.logged >= self.log_interval_s:
            log.warning(
                "throttled_peer_dropping",
                peer=describe_peer(peer),
                dropped=st.dropped,
                remaining_s=round(st.until - now, 3),
            )
            st.dropped = 0
            st.logged = now
        return True

    def bad_frame(self, peer: Hashable, reason: str) -> bool:
        """Count one bad frame from ``peer``; True while it is within its allowance (answer
        it), False when this frame throttled it (it is logged here; answer nothing)."""
        st = self._throttled.get(peer)
        if st is not None and st.until:
            now = self._clock()
            if now < st.until:  # read before the throttle began (a backlog): unanswered too
                return False
            self._release(peer, st, now)  # its cooldown ended while it sent nothing
        if self._allowance.allow(peer):
            return True
        self._throttle(peer, reason)
        return False

    def _throttle(self, peer: Hashable, reason: str) -> None:
        now = self._clock()
        table = self._throttled
        st = table.pop(peer, None)
        if st is None:
            st = _Throttled()
            if len(table) >= self.max_peers:
                _, old = table.popitem(last=False)
                if old.until:
                    self.active -= 1
        table[peer] = st
        again = st.cooldown and now - st.released < st.cooldown
        cap = self.cooldown_s * MAX_COOLDOWN_FACTOR
        st.cooldown = min(cap, 2 * st.cooldown) if again else self.cooldown_s
        st.until = now + st.cooldown
        st.dropped = 0
        st.logged = now
        self.active += 1
        self.throttles += 1
        log.warning(
            "peer_throttled",
            peer=describe_peer(peer),
            reason=reason,
            cooldown_s=st.cooldown,
            allowance=f"{self.burst} bad frames at once, {self.rate_per_s:g}/s",
        )

    def _release(self, peer: Hashable, st: _Throttled, now: float) -> None:
        st.until = 0.0
        st.released = now
        self.active -= 1
        log.info("peer_released", peer=describe_peer(peer), unlogged_drops=st.dropped)
        st.dropped = 0

    def throttled_now(self) -> int:
        """Peers throttled at this moment."""
        now = self._clock()
        return sum(1 for st in self._throttled.values() if st.until > now)

    def __len__(self) -> int:
        return len(self._throttled)
