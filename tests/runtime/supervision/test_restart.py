"""Restart intensity and backoff, driven with explicit times."""

from __future__ import annotations

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.supervision.restart import (
    Exited,
    GiveUp,
    Healthy,
    Removed,
    Restart,
    RestartPolicy,
    RestartState,
    RestartTracker,
    Started,
)


def crash_loop(tracker: RestartTracker, times: list[float], worker: str = "w1") -> list[object]:
    """Exit the worker at each time, starting it again when told; return every command."""
    commands: list[object] = []
    for now in times:
        out = tracker.handle(Exited(worker, "crashed", exit_code=1), now)
        commands += out
        if out and isinstance(out[0], Restart):
            tracker.handle(Started(worker), out[0].at)
    return commands


def delays(commands: list[object]) -> list[float]:
    """The delay of each Restart command, in order."""
    return [c.delay_s for c in commands if isinstance(c, Restart)]


def test_exit_is_restarted_after_exponential_backoff() -> None:
    """Each restart in a window waits twice as long as the one before."""
    tracker = RestartTracker(RestartPolicy(max_restarts=5, period_s=60, backoff_base_s=0.1))
    commands = crash_loop(tracker, [0.0, 1.0, 2.0, 3.0, 4.0])
    assert all(isinstance(c, Restart) for c in commands)
    assert delays(commands) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    assert [c.attempt for c in commands if isinstance(c, Restart)] == [1, 2, 3, 4, 5]
    assert commands[2] == Restart("w1", at=2.4, attempt=3, delay_s=pytest.approx(0.4))


def test_backoff_is_capped() -> None:
    """The backoff never exceeds backoff_max_s."""
    policy = RestartPolicy(max_restarts=100, period_s=1000, backoff_base_s=1.0, backoff_max_s=5.0)
    commands = crash_loop(RestartTracker(policy), [float(t) for t in range(10)])
    assert delays(commands) == [1, 2, 4, 5, 5, 5, 5, 5, 5, 5]
    assert policy.backoff(10_000) == 5.0


def test_too_many_exits_within_the_period_gives_up() -> None:
    """The exit after max_restarts restarts within period_s gives up; later exits change nothing."""
    tracker = RestartTracker(RestartPolicy(max_restarts=3, period_s=10))
    commands = crash_loop(tracker, [0.0, 1.0, 2.0, 3.0])
    assert [type(c) for c in commands] == [Restart, Restart, Restart, GiveUp]
    assert commands[-1] == GiveUp("w1", "crashed", restarts=3, period_s=10)
    assert tracker.handle(Exited("w1", "crashed"), 4.0) == []
    stats = tracker.statistics(4.0)
    assert stats.workers["w1"].state is RestartState.FAILED
    assert (stats.total_restarts, stats.give_ups) == (3, 1)


def test_restarts_spread_over_time_never_give_up() -> None:
    """Exits further apart than the window allows are restarted for ever (sliding window)."""
    tracker = RestartTracker(RestartPolicy(max_restarts=2, period_s=10))
    commands = crash_loop(tracker, [float(t) for t in range(0, 200, 6)])
    assert all(isinstance(c, Restart) for c in commands)


def test_window_slides_so_old_restarts_stop_counting() -> None:
    """A restart older than period_s no longer counts towards the intensity."""
    tracker = RestartTracker(RestartPolicy(max_restarts=2, period_s=10))
    commands = crash_loop(tracker, [0.0, 5.0, 10.0])
    assert [type(c) for c in commands] == [Restart, Restart, Restart]
    assert tracker.statistics(10.0).workers["w1"].restarts_in_window == 2
    assert isinstance(crash_loop(tracker, [11.0])[0], GiveUp)


def test_healthy_resets_backoff_but_not_intensity() -> None:
    """After Healthy the next restart waits the base delay, yet the window still counts."""
    tracker = RestartTracker(RestartPolicy(max_restarts=3, period_s=60, backoff_base_s=0.1))
    first = crash_loop(tracker, [0.0, 1.0])
    assert delays(first) == pytest.approx([0.1, 0.2])
    tracker.handle(Healthy("w1"), 30.0)
    again = crash_loop(tracker, [31.0, 32.0])
    assert again[0] == Restart("w1", at=31.1, attempt=3, delay_s=pytest.approx(0.1))
    assert isinstance(again[1], GiveUp)


def test_healthy_while_waiting_for_restart_is_ignored() -> None:
    """A Healthy report for a worker that is not running does not reset its backoff."""
    tracker = RestartTracker(RestartPolicy(backoff_base_s=0.1))
    tracker.handle(Exited("w1", "crashed"), 0.0)
    tracker.handle(Healthy("w1"), 0.05)
    [cmd] = tracker.handle(Exited("w1", "crashed"), 1.0)
    assert isinstance(cmd, Restart) and cmd.delay_s == pytest.approx(0.2)


def test_manual_start_of_a_failed_worker_starts_a_clean_slate() -> None:
    """Started after GiveUp (an operator's restart) clears the restart history."""
    tracker = RestartTracker(RestartPolicy(max_restarts=0))
    assert isinstance(tracker.handle(Exited("w1", "no_heartbeat", signal=9), 0.0)[0], GiveUp)
    tracker.handle(Started("w1"), 1.0)
    assert tracker.statistics(1.0).workers["w1"].state is RestartState.RUNNING
    assert isinstance(tracker.handle(Exited("w1", "crashed"), 2.0)[0], GiveUp)


def test_removed_worker_is_forgotten() -> None:
    """Removed drops a worker's history, so a worker added again starts from nothing."""
    tracker = RestartTracker(RestartPolicy(max_restarts=1))
    crash_loop(tracker, [0.0])
    tracker.handle(Removed("w1"), 1.0)
    assert "w1" not in tracker.statistics(1.0).workers
    [cmd] = tracker.handle(Exited("w1", "crashed"), 2.0)
    assert isinstance(cmd, Restart) and cmd.attempt == 1


def test_workers_are_tracked_independently_with_their_own_policies() -> None:
    """One worker's crash loop does not use up another's restarts."""
    tracker = RestartTracker(RestartPolicy(max_restarts=1), policies={"b": RestartPolicy(max_restarts=3)})
    a = crash_loop(tracker, [0.0, 1.0], worker="a")
    b = crash_loop(tracker, [0.0, 1.0, 2.0], worker="b")
    assert [type(c) for c in a] == [Restart, GiveUp]
    assert [type(c) for c in b] == [Restart, Restart, Restart]
    stats = tracker.statistics(2.0)
    assert stats.workers["b"].total_restarts == 3 and stats.workers["a"].last_reason == "crashed"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_restarts": -1},
        {"max_restarts": 1.5},
        {"period_s": 0},
        {"backoff_base_s": -0.1},
        {"backoff_base_s": 2.0, "backoff_max_s": 1.0},
        {"period_s": float("inf")},
    ],
)
def test_bad_policy_is_refused_with_config_error(kwargs: dict[str, float]) -> None:
    """A restart policy with an impossible value is refused at construction."""
    with pytest.raises(ConfigError, match="must be"):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]
