"""A clock a test moves by hand: ``clock.now += 5`` is five seconds later, at once."""

from __future__ import annotations

__all__ = ["Clock"]


class Clock:
    """Seconds, as ``time.monotonic`` gives them, from ``now`` on: call it for the time."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
