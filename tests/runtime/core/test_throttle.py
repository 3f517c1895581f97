"""The throttle of peers that send bad frames (core/throttle.py), on a fake clock."""

from __future__ import annotations

import pytest
import structlog

from support.fake_clock import Clock
from troupe.runtime.core.throttle import MAX_COOLDOWN_FACTOR, PeerThrottle, describe_peer


def throttle(clock: Clock, **kwargs: float) -> PeerThrottle:
    args = {"burst": 3, "rate_per_s": 1.0, "cooldown_s": 10.0, **kwargs}
    return PeerThrottle(int(args["burst"]), args["rate_per_s"], args["cooldown_s"], clock=clock)


def test_a_peer_past_its_allowance_is_throttled_and_others_are_not() -> None:
    clock = Clock(100.0)
    t = throttle(clock)
    assert [t.bad_frame("evil", "junk") for _ in range(4)] == [True, True, True, False]
    assert t.active == 1 and t.throttles == 1 and t.throttled_now() == 1
    assert t.blocked("evil") and t.blocked("evil")
    assert t.dropped == 2
    assert not t.blocked("good") and t.bad_frame("good", "one slip")  # its own allowance


def test_a_throttled_peer_is_released_after_its_cooldown() -> None:
    clock = Clock(100.0)
    t = throttle(clock)
    for _ in range(4):
        t.bad_frame("evil", "junk")
    clock.now += 9.9
    assert t.blocked("evil")
    clock.now += 0.1
    assert not t.blocked("evil")
    assert t.active == 0 and t.throttled_now() == 0
    clock.now += 1.0  # a token earned since the release: one bad frame is answered again
    assert t.bad_frame("evil", "junk")


def test_a_peer_that_keeps_sending_junk_gets_doubled_cooldowns_up_to_a_cap() -> None:
    clock = Clock(100.0)
    t = throttle(clock, burst=1, rate_per_s=0.001)
    cooldowns = []
    t.bad_frame("evil", "junk")
    for _ in range(8):
        assert not t.bad_frame("evil", "junk")  # throttles it (no token left)
        start = clock.now
        while t.blocked("evil"):
            clock.now += 1.0
        cooldowns.append(clock.now - start)
    assert cooldowns == [10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 320.0, 320.0]
    assert cooldowns[-1] == 10.0 * MAX_COOLDOWN_FACTOR
    assert t.throttles == 8


def test_a_peer_that_behaved_for_its_cooldown_starts_again_from_the_base() -> None:
    clock = Clock(100.0)
    t = throttle(clock, burst=1, rate_per_s=0.001)
    t.bad_frame("evil", "junk")
    t.bad_frame("evil", "junk")  # throttled for 10 s
    clock.now += 10.0
    assert not t.blocked("evil")  # released
    t.bad_frame("evil", "junk")  # soon again: 20 s
    clock.now += 20.0
    assert not t.blocked("evil")
    clock.now += 25.0  # quiet for longer than its last cooldown
    t.bad_frame("evil", "junk")
    clock.now += 10.0
    assert not t.blocked("evil")


def test_a_throttled_peer_makes_one_log_line_per_interval_with_the_count() -> None:
    clock = Clock(100.0)
    t = PeerThrottle(burst=1, rate_per_s=1.0, cooldown_s=100.0, log_interval_s=10.0, clock=clock)
    with structlog.testing.capture_logs() as logs:
        t.bad_frame("evil", "junk")
        t.bad_frame("evil", "junk")
        for _ in range(200):  # 25 seconds of junk, eight messages a second
            clock.now += 0.125
            assert t.blocked("evil")
    events = [e["event"] for e in logs]
    assert events == ["peer_throttled", "throttled_peer_dropping", "throttled_peer_dropping"]
    assert [e["dropped"] for e in logs[1:]] == [80, 80]
    assert logs[0]["reason"] == "junk" and logs[0]["cooldown_s"] == 100.0


def test_the_peer_table_is_bounded_and_forgets_throttled_peers_consistently() -> None:
    clock = Clock(100.0)
    t = PeerThrottle(burst=1, rate_per_s=1.0, cooldown_s=10.0, max_peers=4, clock=clock)
    t.bad_frame("evil", "junk")
    t.bad_frame("evil", "junk")
    assert t.active == 1
    for i in range(10):  # new identities, one after another, each throttled in turn
        assert [t.bad_frame(f"peer-{i}", "junk") for _ in range(2)] == [True, False]
    assert len(t) == 4 and t.active == 4 and t.throttled_now() == 4
    assert not t.blocked("evil")  # forgotten: it starts again from a full allowance
    assert t.blocked("peer-9")


@pytest.mark.parametrize("args", [(0, 1.0, 1.0), (1, 0.0, 1.0), (1, 1.0, 0.0), (1, float("nan"), 1.0)])
def test_bad_settings_are_refused(args: tuple[int, float, float]) -> None:
    with pytest.raises(ValueError, match="bad_frames_burst"):
        PeerThrottle(*args)


def test_peers_are_named_by_mailbox_and_connection_and_user() -> None:
    class Mailbox:
        peer = "tcp://127.0.0.1:5000"

    box = Mailbox()
    assert describe_peer((box, b"\x00\x01")) == "tcp://127.0.0.1:5000 <- 0001"
    with_user = describe_peer((box, b"\x00\x01", "operator:alice"))
    assert with_user == "tcp://127.0.0.1:5000 <- 0001 (operator:alice)"

    class Transport:
        address = "mem://probe"

    assert describe_peer(Transport()) == "mem://probe"
