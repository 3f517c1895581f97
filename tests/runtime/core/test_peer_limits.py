"""Per-peer limits: the token bucket for ERROR replies and the once-per-interval log gate,
driven by a fake clock."""

from __future__ import annotations

import pytest

from support.fake_clock import Clock
from troupe.runtime.core.peer_limits import PeerLogGate, PeerRateLimiter


def test_a_peer_gets_its_burst_then_the_rate() -> None:
    clock = Clock(100.0)
    limiter = PeerRateLimiter(rate_per_s=10.0, burst=5, clock=clock)
    assert [limiter.allow("a") for _ in range(7)] == [True] * 5 + [False] * 2
    clock.now += 0.25  # 2.5 tokens earned
    assert [limiter.allow("a") for _ in range(3)] == [True, True, False]
    clock.now += 60.0  # never more than the burst, however long the peer was quiet
    assert sum(limiter.allow("a") for _ in range(10)) == 5
    assert (limiter.allowed, limiter.refused) == (12, 8)


def test_each_peer_has_its_own_bucket() -> None:
    """A flooding peer exhausts its own allowance only; another peer is answered in full."""
    limiter = PeerRateLimiter(rate_per_s=1.0, burst=3, clock=Clock(100.0))
    assert sum(limiter.allow(("mailbox", b"flood")) for _ in range(1000)) == 3
    assert [limiter.allow(("mailbox", b"other")) for _ in range(3)] == [True] * 3


def test_the_peers_remembered_are_bounded() -> None:
    """A peer that reconnects with a new identity each time cannot grow the table."""
    limiter = PeerRateLimiter(rate_per_s=1.0, burst=1, max_peers=8, clock=Clock(100.0))
    for i in range(1000):
        limiter.allow(i)
    assert len(limiter) == 8
    assert limiter.allow(999) is False  # the most recent peers are the ones kept
    assert limiter.allow(0) is True  # an old one was forgotten: a fresh allowance


@pytest.mark.parametrize("args", [(0.0, 1), (-1.0, 1), (1.0, 0), (float("nan"), 1)])
def test_bad_limits_are_refused(args: tuple[float, int]) -> None:
    with pytest.raises(ValueError, match="rate_per_s"):
        PeerRateLimiter(*args)


def test_the_log_gate_lets_one_line_per_peer_per_interval_and_counts_the_rest() -> None:
    clock = Clock(100.0)
    gate = PeerLogGate(interval_s=10.0, clock=clock)
    assert gate.should_log("a") is True
    assert [gate.should_log("a") for _ in range(5)] == [False] * 5
    assert gate.should_log("b") is True
    clock.now += 10.0
    assert gate.should_log("a") is True
    assert gate.take_quiet("a") == 5 and gate.take_quiet("a") == 0
    assert gate.take_quiet("b") == 0


def test_the_log_gate_is_bounded() -> None:
    gate = PeerLogGate(interval_s=10.0, max_peers=4, clock=Clock(100.0))
    for i in range(100):
        assert gate.should_log(i) is True
    assert gate.should_log(99) is False
    assert gate.should_log(0) is True  # forgotten: logged again
