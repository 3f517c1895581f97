"""Restart policy and intensity for worker processes (pure), after Erlang/OTP supervisors.

When a worker exits, the node asks a :class:`RestartTracker` what to do:

- ``Restart(worker_id, at=now + backoff)``: start it again at ``at``. The backoff doubles with
  each restart in the current window since the worker last proved healthy:
  ``min(backoff_base_s * 2**n, backoff_max_s)``, where ``n`` counts those earlier restarts.
- ``GiveUp(worker_id, reason)``: more than ``max_restarts`` exits happened within ``period_s``
  (intensity exceeded). The worker is reported failed and left down; the node stays up.

``Healthy`` (the driver sends it once a worker has served for a while) resets the backoff, not
the intensity window: a worker that keeps dying is still given up on. ``Removed`` forgets a
worker that was stopped on purpose, so its exit does not count.

No I/O, no clock reads: time comes in as ``now`` (monotonic seconds).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from troupe.runtime.errors import ConfigError

__all__ = [
    "Exited",
    "GiveUp",
    "Healthy",
    "Removed",
    "Restart",
    "RestartCommand",
    "RestartEvent",
    "RestartPolicy",
    "RestartState",
    "RestartStatistics",
    "RestartTracker",
    "Started",
    "WorkerRestarts",
]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How often a worker may be restarted, and how long to wait before each restart.

    Attributes:
        max_restarts: restarts allowed within ``period_s``; one more exit gives up.
        period_s: the sliding window for ``max_restarts``.
        backoff_base_s: the delay before the first restart of a streak.
        backoff_max_s: the cap on the doubling delay.
    """

    max_restarts: int = 5
    period_s: float = 60.0
    backoff_base_s: float = 0.1
    backoff_max_s: float = 10.0

    def __post_init__(self) -> None:
        if (
            not isinstance(self.max_restarts, int)
            or isinstance(self.max_restarts, bool)
            or self.max_restarts < 0
        ):
            raise ConfigError(
                f"max_restarts must be an integer >= 0 (0 = never restart), got {self.max_restarts!r}"
            )
        if not _number(self.period_s) or self.period_s <= 0:
            raise ConfigError(f"period_s must be a number > 0, got {self.period_s!r}")
        if not _number(self.backoff_base_s) or self.backoff_base_s < 0:
            raise ConfigError(f"backoff_base_s must be a number >= 0, got {self.backoff_base_s!r}")
        if not _number(self.backoff_max_s) or self.backoff_max_s < self.backoff_base_s:
            raise ConfigError(
                f"backoff_max_s must be a number >= backoff_base_s ({self.backoff_base_s}), "
                f"got {self.backoff_max_s!r}"
            )

    def backoff(self, streak: int) -> float:
        """The delay before a restart that follows ``streak`` earlier restarts in the streak."""
        if self.backoff_base_s == 0:
            return 0.0
        # Capping the exponent keeps 2**streak from overflowing a float for absurd streaks.
        return min(self.backoff_base_s * 2.0 ** min(streak, 64), self.backoff_max_s)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# Events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """The worker process is running (first start, a restart, or an operator's manual start)."""

    worker_id: str


@dataclass(frozen=True, slots=True)
class Exited:
    """The worker process ended without being asked to.

    Attributes:
        reason: why, in a word: ``no_heartbeat``, ``no_progress``, ``crashed``, ``killed``...
        exit_code: the process exit status, when it exited by itself.
        signal: the signal number that ended it, when one did.
    """

    worker_id: str
    reason: str
    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True, slots=True)
class Healthy:
    """The worker has served long enough to count as recovered: reset its backoff."""

    worker_id: str


@dataclass(frozen=True, slots=True)
class Removed:
    """The worker was stopped on purpose or removed from the node: forget it."""

    worker_id: str


RestartEvent = Started | Exited | Healthy | Removed


# Commands ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Restart:
    """Start the worker again at monotonic time ``at``.

    Attributes:
        attempt: the number of this restart within the current window (1 = first).
        delay_s: ``at - now`` when the command was made.
    """

    worker_id: str
    at: float
    attempt: int
    delay_s: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Leave the worker down and report it failed: it exited too often.

    Attributes:
        reason: the reason of the last exit.
        restarts: restarts already made within the window.
        period_s: the window.
    """

    worker_id: str
    reason: str
    restarts: int
    period_s: float


RestartCommand = Restart | GiveUp


# Statistics --------------------------------------------------------------------------------


class RestartState(enum.StrEnum):
    """Where a worker stands in its restart life cycle."""

    RUNNING = "running"
    RESTARTING = "restarting"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class WorkerRestarts:
    """One worker's restart record, as ``ctl status`` shows it."""

    worker_id: str
    state: RestartState
    restarts_in_window: int
    total_restarts: int
    last_reason: str | None


@dataclass(frozen=True, slots=True)
class RestartStatistics:
    """A read-only view of the tracker at one moment."""

    workers: Mapping[str, WorkerRestarts]
    total_restarts: int
    give_ups: int


@dataclass(slots=True)
class _Record:
    state: RestartState = RestartState.RUNNING
    restarts: deque[float] = field(default_factory=deque)  # times of restarts in the window
    healthy_since: float = -math.inf
    total: int = 0
    last_reason: str | None = None


class RestartTracker:
    """Decides whether and when an exited worker is restarted.

    Args:
        policy: the restart policy for workers without their own.
        policies: per-worker policies, by worker id.
    """

    def __init__(
        self,
        policy: RestartPolicy | None = None,
        policies: Mapping[str, RestartPolicy] | None = None,
    ) -> None:
        self._default = policy or RestartPolicy()
        self._policies = dict(policies or {})
        self._records: dict[str, _Record] = {}
        self._total_restarts = 0
        self._give_ups = 0

    def policy_for(self, worker_id: str) -> RestartPolicy:
        """Return the restart policy that applies to ``worker_id``."""
        return self._policies.get(worker_id, self._default)

    def handle(self, event: RestartEvent, now: float) -> list[RestartCommand]:
        """Apply one event at time ``now`` and return what to do.

        Args:
            event: Started, Exited, Healthy or Removed.
            now: the current monotonic time in seconds.

        Returns:
            At most one Restart or GiveUp (only ever for an Exited event).
        """
        if isinstance(event, Exited):
            return self._exited(event, now)
        if isinstance(event, Started):
            rec = self._records.setdefault(event.worker_id, _Record())
            if rec.state is RestartState.FAILED:
                # Only an operator starts a failed worker: give it a clean slate.
                self._records[event.worker_id] = _Record()
            else:
                rec.state = RestartState.RUNNING
            return []
        if isinstance(event, Healthy):
            rec_h = self._records.get(event.worker_id)
            if rec_h is not None and rec_h.state is RestartState.RUNNING:
                rec_h.healthy_since = now
            return []
        if isinstance(event, Removed):
            self._records.pop(event.worker_id, None)
            return []
        raise TypeError(f"unknown restart event {event!r}")

    def statistics(self, now: float) -> RestartStatistics:
        """Return a frozen view of every tracked worker, with windows measured at ``now``."""
        workers = {}
        for wid, rec in self._records.items():
            window_start = now - self.policy_for(wid).period_s
            workers[wid] = WorkerRestarts(
                worker_id=wid,
                state=rec.state,
                restarts_in_window=sum(1 for t in rec.restarts if t > window_start),
                total_restarts=rec.total,
                last_reason=rec.last_reason,
            )
        return RestartStatistics(
            workers=MappingProxyType(workers),
            total_restarts=self._total_restarts,
            give_ups=self._give_ups,
        )

    def _exited(self, event: Exited, now: float) -> list[RestartCommand]:
        rec = self._records.setdefault(event.worker_id, _Record())
        if rec.state is RestartState.FAILED:
            return []  # already given up; a late duplicate report changes nothing
        policy = self.policy_for(event.worker_id)
        rec.last_reason = event.reason
        while rec.restarts and rec.restarts[0] <= now - policy.period_s:
            rec.restarts.popleft()
        if len(rec.restarts) >= policy.max_restarts:
            rec.state = RestartState.FAILED
            self._give_ups += 1
            return [GiveUp(event.worker_id, event.reason, len(rec.restarts), policy.period_s)]
        streak = sum(1 for t in rec.restarts if t >= rec.healthy_since)
        delay = policy.backoff(streak)
        rec.restarts.append(now)
        rec.total += 1
        rec.state = RestartState.RESTARTING
        self._total_restarts += 1
        return [Restart(event.worker_id, now + delay, len(rec.restarts), delay)]
