"""The supervisor's heartbeat monitor: which worker is hung and must be killed (pure).

A worker is judged on two clocks, set per actor kind by a :class:`LivenessPolicy`:

- **heartbeat**: no beat at all for ``heartbeat_timeout_s`` (the process is dead, deadlocked,
  or stuck in a C call that holds the GIL, which also stops the heartbeat thread)
  -> ``Kill(reason="no_heartbeat")``.
- **progress**: beats keep arriving but ``messages_handled + progress_count`` has not changed
  for ``progress_timeout_s`` while the worker is busy (blocked on a lock, waiting forever on I/O)
  -> ``Kill(reason="no_progress")``. Busy means handling a message, or holding messages in its
  mailboxes (the beat's ``backlog``): a worker whose loop and beats go on while its messages
  wait unhandled (an actor stuck on an await with messages queued behind it, while another
  actor of the process went idle) is hung as well. Idle workers with empty mailboxes and
  stopping workers never trip this clock, and a kind whose work legitimately goes quiet can
  disable it (``progress_timeout_s=None``).

Timeouts are checked on :class:`Tick` only. Detection guarantee (invariant 5): when the driver
sends a Tick at least every ``interval_s``, a worker whose last beat was at ``t`` is killed by
``t + heartbeat_timeout_s + interval_s``.

Silence is counted only while the driver could hear it. A driver whose own tick comes far later
than it planned (by :attr:`LivenessMonitor.resume_after_s`) was stopped with its workers: the
whole node paused (SIGSTOP of its process tree, ``docker pause``, a frozen cgroup, a paused VM),
and on the resume no worker has beaten yet. It sends :class:`Resumed` with the gap since its last
tick, and every worker's clocks move on by it (never past ``now``): a healthy worker beats again
within an interval, and a worker really hung is killed one ``heartbeat_timeout_s`` after the
resume. Without it, every worker of a paused node was killed as ``no_heartbeat`` on the resume.

After a Kill the worker is marked killed: no second Kill, and beats are ignored until the
worker is registered again (a restart is a new pid). Beats from unknown workers, stale pids or
late datagrams are ignored, so nothing is resurrected by a late datagram.

A beat's ``seq`` goes up by one per beat. One a little below the last (fewer than
:func:`reorder_window` beats: a reordered or repeated datagram) is ignored; one far below is
taken, as the sender's own sequence: the beat before it, far ahead, cannot have come from that
sender (a pid does not restart its heartbeat thread), so it was forged. Without that rule one
datagram with a huge ``seq`` (unsigned beats, a cluster without keys) made every real beat of
the worker look old, and the worker was killed for silence while it beat on. The window keeps
what a forged beat can hide to fewer beats than the heartbeat timeout. Such a beat is reported
once per worker (:meth:`LivenessMonitor.take_suspect_beats`) for the driver to log.

The monitor does no I/O and reads no clock; a thin driver feeds it events with ``now`` (from
``time.monotonic()``) and performs the commands.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from troupe.runtime.errors import ConfigError

from .status import StatusSnapshot, WorkerState

__all__ = [
    "Beat",
    "Kill",
    "KillReason",
    "LivenessEvent",
    "LivenessMonitor",
    "LivenessPolicy",
    "LivenessStatistics",
    "Register",
    "Resumed",
    "SuspectBeat",
    "Tick",
    "Unregister",
    "WorkerLiveness",
]


@dataclass(frozen=True, slots=True)
class LivenessPolicy:
    """How a kind of worker is judged.

    Attributes:
        interval_s: how often the worker beats (and how often the driver should tick).
        heartbeat_timeout_s: silence after which the worker is killed.
        progress_timeout_s: busy time without progress after which the worker is killed;
            None disables the progress check.
        startup_timeout_s: silence allowed between registration and the first beat (imports
            such as torch can be slow); None means ``heartbeat_timeout_s``.
    """

    interval_s: float = 0.5
    heartbeat_timeout_s: float = 3.0
    progress_timeout_s: float | None = 30.0
    startup_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not _positive(self.interval_s):
            raise ConfigError(f"interval_s must be a number > 0, got {self.interval_s!r}")
        if not _positive(self.heartbeat_timeout_s) or self.heartbeat_timeout_s <= self.interval_s:
            raise ConfigError(
                f"heartbeat_timeout_s must be greater than interval_s ({self.interval_s}), got "
                f"{self.heartbeat_timeout_s!r}; use several intervals (e.g. 6x) so one late "
                "datagram does not kill a healthy worker"
            )
        if self.progress_timeout_s is not None and not _positive(self.progress_timeout_s):
            raise ConfigError(
                f"progress_timeout_s must be a number > 0 or None (disabled), got {self.progress_timeout_s!r}"
            )
        if self.startup_timeout_s is not None and not _positive(self.startup_timeout_s):
            raise ConfigError(
                f"startup_timeout_s must be a number > 0 or None (same as heartbeat_timeout_s), "
                f"got {self.startup_timeout_s!r}"
            )


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def reorder_window(policy: LivenessPolicy) -> int:
    """How many beats below the last a beat's ``seq`` may be and still be taken for a late
    datagram (ignored): half the beats of a heartbeat timeout, at least 1. A forged beat a
    little ahead of the real ones hides at most this many of them, so the worker is never
    silent for a whole timeout because of it (3 beats of 0.5 s against 3 s, by default)."""
    return max(1, int(policy.heartbeat_timeout_s / policy.interval_s) // 2)


def _busy(status: StatusSnapshot) -> bool:
    """Whether the worker owes progress: handling a message, or messages waiting for it."""
    state = status.state
    return state is WorkerState.BUSY or (state is WorkerState.IDLE and status.backlog > 0)


# Events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Register:
    """A worker process started (or restarted with a new pid); start watching it."""

    worker_id: str
    pid: int
    kind: str


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat arrived from a worker."""

    snapshot: StatusSnapshot


@dataclass(frozen=True, slots=True)
class Unregister:
    """The worker is gone or was stopped on purpose; stop watching it."""

    worker_id: str


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed; check every worker's deadlines."""


@dataclass(frozen=True, slots=True)
class Resumed:
    """The driver was not running for ``gap_s`` seconds (the time since its last tick): what it
    did not hear is no worker's silence."""

    gap_s: float


LivenessEvent = Register | Beat | Unregister | Tick | Resumed


# Commands ----------------------------------------------------------------------------------


class KillReason(enum.StrEnum):
    """Why the monitor asks for a worker to be killed."""

    NO_HEARTBEAT = "no_heartbeat"
    NO_PROGRESS = "no_progress"


@dataclass(frozen=True, slots=True)
class Kill:
    """SIGKILL this worker process and report it.

    Attributes:
        worker_id: the worker to kill.
        pid: the process to kill (the one registered, never a pid from a datagram).
        reason: no_heartbeat or no_progress.
        last_status: the last snapshot received, or None if the worker never beat.
        silent_s: how long the worker went without a beat (no_heartbeat) or without
            progress (no_progress).
    """

    worker_id: str
    pid: int
    reason: KillReason
    last_status: StatusSnapshot | None
    silent_s: float


# Statistics --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerLiveness:
    """One watched worker, as ``ctl status`` shows it.

    Attributes:
        backlog: messages waiting in its mailboxes at the last beat, or None if it never beat.
        last_beat_age_s: seconds since the last beat, or None if it never beat.
        last_progress_age_s: seconds since progress was last seen (or the worker was last
            seen not busy), or None if it never beat.
    """

    worker_id: str
    pid: int
    kind: str
    state: WorkerState | None
    last_beat_age_s: float | None
    last_progress_age_s: float | None
    killed: bool
    backlog: int | None = None


@dataclass(frozen=True, slots=True)
class SuspectBeat:
    """A worker's beat whose ``seq`` went back far below the last one taken: that one was
    forged (or came from no beat this worker sent); the sender's beats are taken again.

    Attributes:
        worker_id: the worker.
        pid: its pid (registered, and in both beats).
        seq: the beat's seq.
        last_seq: the seq of the beat before it, far ahead.
    """

    worker_id: str
    pid: int
    seq: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class LivenessStatistics:
    """A read-only view of the monitor at one moment."""

    workers: Mapping[str, WorkerLiveness]
    kills_by_reason: Mapping[str, int]
    ignored_beats: int


@dataclass(slots=True)
class _Watched:
    pid: int
    kind: str
    policy: LivenessPolicy
    registered_at: float
    last_beat_at: float | None = None
    last_progress_at: float | None = None
    last_mark: int = -1
    last_seq: int = -1
    last_status: StatusSnapshot | None = None
    killed: bool = False
    suspect_told: bool = False  # a SuspectBeat was reported for this incarnation

    def heartbeat_deadline(self) -> float:
        if self.last_beat_at is None:
            startup = self.policy.startup_timeout_s or self.policy.heartbeat_timeout_s
            return self.registered_at + startup
        return self.last_beat_at + self.policy.heartbeat_timeout_s

    def progress_deadline(self) -> float | None:
        status, timeout = self.last_status, self.policy.progress_timeout_s
        if timeout is None or status is None or not _busy(status):
            return None
        assert self.last_progress_at is not None  # set with the first beat
        return self.last_progress_at + timeout


@dataclass(slots=True)
class _Counts:
    kills: Counter[str] = field(default_factory=Counter)
    ignored_beats: int = 0


class LivenessMonitor:
    """Decides which workers are hung, from registrations, beats and ticks.

    Args:
        policies: the policy for each actor kind.
        default: the policy for kinds not in ``policies``.
    """

    def __init__(
        self,
        policies: Mapping[str, LivenessPolicy] | None = None,
        default: LivenessPolicy | None = None,
    ) -> None:
        self._policies = dict(policies or {})
        self._default = default or LivenessPolicy()
        self._workers: dict[str, _Watched] = {}
        self._counts = _Counts()
        self._suspects: list[SuspectBeat] = []

    def policy_for(self, kind: str) -> LivenessPolicy:
        """Return the policy that applies to workers of ``kind``."""
        return self._policies.get(kind, self._default)

    @property
    def tick_interval_s(self) -> float:
        """How often the driver should send Tick: the shortest beat interval of any policy."""
        return min([self._default.interval_s, *(p.interval_s for p in self._policies.values())])

    @property
    def resume_after_s(self) -> float:
        """How much later than planned a driver's tick may come before the driver takes itself
        for stopped and sends :class:`Resumed`: half the shortest heartbeat timeout of any
        policy, far beyond a loaded machine's lateness, and short of a kill."""
        policies = [self._default, *self._policies.values()]
        return min(p.heartbeat_timeout_s for p in policies) / 2

    def handle(self, event: LivenessEvent, now: float) -> list[Kill]:
        """Apply one event at time ``now`` and return the kills to perform.

        Args:
            event: Register, Beat, Unregister or Tick.
            now: the current monotonic time in seconds.

        Returns:
            The workers to SIGKILL (only ever produced by a Tick).
        """
        if isinstance(event, Beat):
            self._beat(event.snapshot, now)
            return []
        if isinstance(event, Tick):
            return self._tick(now)
        if isinstance(event, Register):
            self._workers[event.worker_id] = _Watched(
                pid=event.pid,
                kind=event.kind,
                policy=self.policy_for(event.kind),
                registered_at=now,
            )
            return []
        if isinstance(event, Unregister):
            self._workers.pop(event.worker_id, None)
            return []
        if isinstance(event, Resumed):
            self._forgive(event.gap_s, now)
            return []
        raise TypeError(f"unknown liveness event {event!r}")

    def next_deadline(self) -> float | None:
        """The earliest time at which a Tick could kill someone, or None if nothing is watched.

        A driver may sleep until ``min(next_deadline(), now + tick_interval_s)``.
        """
        deadlines: list[float] = []
        for w in self._workers.values():
            if w.killed:
                continue
            deadlines.append(w.heartbeat_deadline())
            progress = w.progress_deadline()
            if progress is not None:
                deadlines.append(progress)
        return min(deadlines, default=None)

    def statistics(self, now: float) -> LivenessStatistics:
        """Return a frozen view of every watched worker, with ages measured at ``now``."""
        workers = {
            wid: WorkerLiveness(
                worker_id=wid,
                pid=w.pid,
                kind=w.kind,
                state=None if w.last_status is None else w.last_status.state,
                last_beat_age_s=None if w.last_beat_at is None else now - w.last_beat_at,
                last_progress_age_s=(None if w.last_progress_at is None else now - w.last_progress_at),
                killed=w.killed,
                backlog=None if w.last_status is None else w.last_status.backlog,
            )
            for wid, w in self._workers.items()
        }
        return LivenessStatistics(
            workers=MappingProxyType(workers),
            kills_by_reason=MappingProxyType(dict(self._counts.kills)),
            ignored_beats=self._counts.ignored_beats,
        )

    def take_suspect_beats(self) -> list[SuspectBeat]:
        """The suspect beats seen since the last call (at most one per worker incarnation), for
        the driver to log."""
        suspects, self._suspects = self._suspects, []
        return suspects

    def _beat(self, snap: StatusSnapshot, now: float) -> None:
        w = self._workers.get(snap.worker_id)
        # A beat from an unknown worker, an old incarnation (stale pid) or a killed worker must
        # not refresh any clock.
        if w is None or w.pid != snap.pid or w.killed:
            self._counts.ignored_beats += 1
            return
        if snap.seq <= w.last_seq:
            if w.last_seq - snap.seq < reorder_window(w.policy):  # a late or repeated datagram
                self._counts.ignored_beats += 1
                return
            # Far below: the beat taken before, far ahead, was not this sender's (see the module).
            if not w.suspect_told:
                w.suspect_told = True
                self._suspects.append(SuspectBeat(snap.worker_id, snap.pid, snap.seq, w.last_seq))
        w.last_seq = snap.seq
        w.last_beat_at = now
        w.last_status = snap
        mark = snap.progress_mark
        # Not busy counts as progress too: the progress clock of a busy spell must start when
        # the spell starts, not at the last message before a long idle time.
        if mark != w.last_mark or not _busy(snap):
            w.last_mark = mark
            w.last_progress_at = now

    def _forgive(self, gap_s: float, now: float) -> None:
        """Move every clock of every watched worker on by ``gap_s``, never past ``now``: the
        silence and the busy time are judged from the resume, as if the gap had not been."""
        for w in self._workers.values():
            w.registered_at = min(now, w.registered_at + gap_s)
            if w.last_beat_at is not None:
                w.last_beat_at = min(now, w.last_beat_at + gap_s)
            if w.last_progress_at is not None:
                w.last_progress_at = min(now, w.last_progress_at + gap_s)

    def _tick(self, now: float) -> list[Kill]:
        kills: list[Kill] = []
        for wid, w in self._workers.items():
            if w.killed:
                continue
            reason: KillReason | None = None
            since = 0.0
            if now >= w.heartbeat_deadline():
                reason = KillReason.NO_HEARTBEAT
                since = now - (w.last_beat_at if w.last_beat_at is not None else w.registered_at)
            else:
                progress = w.progress_deadline()
                if progress is not None and now >= progress:
                    reason = KillReason.NO_PROGRESS
                    assert w.last_progress_at is not None
                    since = now - w.last_progress_at
            if reason is None:
                continue
            w.killed = True
            self._counts.kills[reason.value] += 1
            kills.append(Kill(wid, w.pid, reason, w.last_status, since))
        return kills
