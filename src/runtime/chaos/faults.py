"""Fault injection: the in-process effects that tests and chaos runs use to break workers.

A :class:`FaultPlan` holds the active faults, parsed once from plain dicts such as
``{"kind": "slow", "seconds": 0.2, "actor": "renderer"}``. The actor runtime calls
:func:`apply_before_handle` before every handler; it performs the fault or returns ``DROP``.

Kinds, and what each one looks like to the supervisor:

=============== ===================================================== =====================
kind            effect                                                the supervisor sees
=============== ===================================================== =====================
kill            SIGKILL this process                                  an exit, signal 9
crash           raise :class:`FaultInjected` inside the handler       an error reply
hang_with_gil   a C call that holds the GIL for ``seconds``           no heartbeat
stall           block on a lock, GIL released, for ``seconds`` or     beats, no progress
                until :meth:`FaultPlan.release_stalls`
slow            sleep ``seconds`` before each message                 slow progress
drop            lose the message                                      nothing
partition       the transport refuses traffic to/from ``peers``       unreachable peers
=============== ===================================================== =====================

Common fields select and pace a fault: ``actor`` and ``message_type`` (absent = all),
``after`` (let this many matching messages through first), ``count`` (fire at most this many
times) and ``probability`` (fire on each eligible message with this chance, seeded by the
plan). ``partition`` takes only ``peers`` and is consulted by the transport, not here.

The effects block the calling thread on purpose: a slow or stuck handler blocks its event loop
the same way.
"""

from __future__ import annotations

import ctypes
import enum
import math
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NoReturn

from troupe.runtime.core.cell import DROP, PROCEED, Verdict
from troupe.runtime.errors import ConfigError, FaultInjected
from troupe.runtime.library_logging import get_logger

__all__ = [
    "DROP",
    "PROCEED",
    "FaultKind",
    "FaultPlan",
    "FaultSpec",
    "FaultStatistics",
    "StallGate",
    "Verdict",
    "apply_before_handle",
    "crash",
    "hang_with_gil",
    "kill_process",
    "slow",
]

log = get_logger(__name__)


class FaultKind(enum.StrEnum):
    """The kinds of fault; the values are the ``kind`` strings of a fault spec."""

    KILL = "kill"
    CRASH = "crash"
    HANG_WITH_GIL = "hang_with_gil"
    STALL = "stall"
    SLOW = "slow"
    DROP = "drop"
    PARTITION = "partition"


_TIMED = {FaultKind.HANG_WITH_GIL, FaultKind.STALL, FaultKind.SLOW}
_COMMON = {"kind", "actor", "message_type", "after", "count", "probability"}


# The primitives ----------------------------------------------------------------------------


def kill_process() -> NoReturn:
    """SIGKILL this process: no cleanup, no finally blocks, like the OOM killer."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL did not end the process")  # pragma: no cover


def crash(actor: str = "", message_type: str = "") -> NoReturn:
    """Raise :class:`FaultInjected`, as a handler with a bug would raise."""
    raise FaultInjected(f"injected crash in actor {actor!r} handling {message_type!r}")


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def hang_with_gil(seconds: float) -> None:
    """Block in one C call for ``seconds`` *while holding the GIL* (POSIX only).

    ``ctypes.PyDLL`` calls foreign functions without releasing the GIL, unlike ``CDLL``; so
    libc's ``nanosleep`` through it freezes every Python thread of the process, the heartbeat
    thread included, as a simulator stuck inside a C extension does. A signal may end the
    sleep early.
    """
    _check_seconds(seconds, "hang_with_gil")
    whole = math.floor(seconds)
    ts = _Timespec(int(whole), int((seconds - whole) * 1e9))
    # One call, not a loop: returning to Python between chunks would let other threads run.
    ctypes.PyDLL(None).nanosleep(ctypes.byref(ts), None)


def slow(seconds: float) -> None:
    """Delay the caller by ``seconds``, releasing the GIL (heartbeats keep flowing)."""
    _check_seconds(seconds, "slow")
    time.sleep(seconds)


class StallGate:
    """A closed gate that blocks callers on a lock acquire, with the GIL released.

    The heartbeat thread keeps beating while a handler waits here, but the worker makes no
    progress: the supervisor's ``no_progress`` case. ``release()`` opens the gate for good.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # held by the gate itself until release()
        self._guard = threading.Lock()
        self._open = False

    @property
    def is_open(self) -> bool:
        """Whether release() was called."""
        return self._open

    def wait(self, seconds: float | None = None) -> bool:
        """Block until the gate opens or ``seconds`` pass (None = no limit).

        Returns:
            True if the gate is open, False if the time ran out.
        """
        if self._lock.acquire(timeout=-1 if seconds is None else seconds):
            self._lock.release()  # pass the open gate on to the next waiter
            return True
        return False

    def release(self) -> None:
        """Open the gate and let every waiter (now and later) through; idempotent."""
        with self._guard:
            if not self._open:
                self._open = True
                self._lock.release()


def _check_seconds(seconds: object, where: str) -> None:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise ConfigError(f"{where}: seconds must be a finite number >= 0, got {seconds!r}")


# Specs and the plan ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One validated fault. Build it with :meth:`from_dict`.

    Attributes:
        kind: which fault.
        actor: the actor name it applies to; None = every actor.
        message_type: the message type it applies to; None = every type.
        seconds: duration for hang_with_gil, slow and stall (None = until released, stall only).
        after: matching messages let through before the fault is armed.
        count: the most times it fires; None = no limit.
        probability: the chance it fires on each eligible message.
        peers: the peers cut off by a partition.
    """

    kind: FaultKind
    actor: str | None = None
    message_type: str | None = None
    seconds: float | None = None
    after: int = 0
    count: int | None = None
    probability: float = 1.0
    peers: frozenset[str] = frozenset()

    @classmethod
    def from_dict(cls, spec: Mapping[str, object], where: str = "fault spec") -> FaultSpec:
        """Validate a plain dict (from TOML, JSON or a test) into a spec.

        Args:
            spec: e.g. ``{"kind": "drop", "actor": "encoder", "probability": 0.1}``.
            where: how error messages name this spec (e.g. ``"faults[2]"``).

        Raises:
            ConfigError: the spec is malformed; the message names the field and the fix.
        """
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where} must be a table/dict with a 'kind', got {spec!r}")
        kinds = ", ".join(k.value for k in FaultKind)
        raw_kind = spec.get("kind")
        if not isinstance(raw_kind, str) or raw_kind not in {k.value for k in FaultKind}:
            raise ConfigError(f"{where}: 'kind' must be one of {kinds}; got {raw_kind!r}")
        kind = FaultKind(raw_kind)
        allowed = {"kind", "peers"} if kind is FaultKind.PARTITION else set(_COMMON)
        if kind in _TIMED:
            allowed.add("seconds")
        unknown = sorted(str(k) for k in spec if k not in allowed)
        if unknown:
            raise ConfigError(
                f"{where}: field(s) {', '.join(unknown)} not allowed for kind {kind.value!r}; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
        if kind is FaultKind.PARTITION:
            peers = spec.get("peers")
            if (
                not isinstance(peers, list | tuple | set | frozenset)
                or not peers
                or not all(isinstance(p, str) and p for p in peers)
            ):
                raise ConfigError(
                    f"{where}: a partition needs 'peers', a non-empty list of peer addresses, "
                    f'e.g. ["tcp://127.0.0.1:5601"]; got {peers!r}'
                )
            return cls(kind=kind, peers=frozenset(peers))
        return cls(
            kind=kind,
            actor=_opt_str(spec, "actor", where),
            message_type=_opt_str(spec, "message_type", where),
            seconds=_seconds(spec, kind, where),
            after=_int(spec, "after", 0, where) or 0,
            count=_int(spec, "count", None, where),
            probability=_probability(spec, where),
        )

    def matches(self, actor: str, message_type: str) -> bool:
        """Whether this fault applies to ``message_type`` arriving at ``actor``."""
        return (self.actor is None or self.actor == actor) and (
            self.message_type is None or self.message_type == message_type
        )


def _opt_str(spec: Mapping[str, object], key: str, where: str) -> str | None:
    value = spec.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value if isinstance(value, str) else None


def _seconds(spec: Mapping[str, object], kind: FaultKind, where: str) -> float | None:
    if kind not in _TIMED:
        return None
    value = spec.get("seconds")
    if value is None and kind is FaultKind.STALL:
        return None  # stall until released
    try:
        _check_seconds(value, f"{where} (kind {kind.value!r})")
    except ConfigError as exc:
        raise ConfigError(f'{exc}; e.g. "seconds": 0.5') from None
    assert isinstance(value, int | float)
    return float(value)


def _int(spec: Mapping[str, object], key: str, default: int | None, where: str) -> int | None:
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: {key!r} must be an integer >= 0, got {value!r}")
    return value


def _probability(spec: Mapping[str, object], where: str) -> float:
    value = spec.get("probability", 1.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{where}: 'probability' must be a number in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class FaultStatistics:
    """What the plan has injected so far."""

    fired_by_kind: Mapping[str, int]
    partitioned_peers: frozenset[str]
    stalls_released: bool


class FaultPlan:
    """The active faults of one process, and the little state they need (counts, a seeded RNG).

    Args:
        specs: the faults, applied in order.
        seed: seeds the RNG behind ``probability``, so a chaos run can be replayed.
    """

    def __init__(self, specs: Iterable[FaultSpec] = (), seed: int | None = None) -> None:
        self.specs: tuple[FaultSpec, ...] = tuple(specs)
        self._handled = tuple(s for s in self.specs if s.kind is not FaultKind.PARTITION)
        self._partitioned = frozenset(p for s in self.specs if s.kind is FaultKind.PARTITION for p in s.peers)
        self._rng = random.Random(seed)
        self._seen = [0] * len(self._handled)
        self._fired = [0] * len(self._handled)
        self._by_kind: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._gate = StallGate()

    @classmethod
    def from_dicts(
        cls, specs: Iterable[Mapping[str, object]] | Mapping[str, object], seed: int | None = None
    ) -> FaultPlan:
        """Parse one spec dict or a list of them.

        Raises:
            ConfigError: a spec is malformed.
        """
        if isinstance(specs, Mapping):
            specs = [specs]
        return cls((FaultSpec.from_dict(s, f"faults[{i}]") for i, s in enumerate(specs)), seed)

    @property
    def active(self) -> bool:
        """Whether any fault applies to handlers (the runtime's fast path skips the hook)."""
        return bool(self._handled)

    def is_partitioned(self, peer: str) -> bool:
        """Whether the transport must refuse traffic to or from ``peer``."""
        return peer in self._partitioned

    def heal(self) -> None:
        """End every partition."""
        self._partitioned = frozenset()

    def release_stalls(self) -> None:
        """Unblock every stalled handler, now and later."""
        self._gate.release()

    def next_faults(self, actor: str, message_type: str) -> list[FaultSpec]:
        """Advance the counters for one message and return the faults that fire on it, in order.

        :func:`apply_before_handle` performs them; this is exposed for runtimes that want to
        perform a fault their own way (an async sleep for ``slow``).
        """
        firing: list[FaultSpec] = []
        with self._lock:
            for i, spec in enumerate(self._handled):
                if not spec.matches(actor, message_type):
                    continue
                self._seen[i] += 1
                if self._seen[i] <= spec.after:
                    continue
                if spec.count is not None and self._fired[i] >= spec.count:
                    continue
                if spec.probability < 1.0 and self._rng.random() >= spec.probability:
                    continue
                self._fired[i] += 1
                self._by_kind[spec.kind.value] += 1
                firing.append(spec)
                if spec.kind is FaultKind.DROP:
                    break  # a dropped message meets no later fault
        return firing

    def statistics(self) -> FaultStatistics:
        """Return what has been injected so far."""
        with self._lock:
            fired = dict(self._by_kind)
        return FaultStatistics(
            fired_by_kind=MappingProxyType(fired),
            partitioned_peers=self._partitioned,
            stalls_released=self._gate.is_open,
        )

    def stall(self, seconds: float | None) -> None:
        """Block the caller on the plan's stall gate for ``seconds`` (None = until released)."""
        self._gate.wait(seconds)


def apply_before_handle(plan: FaultPlan, actor_name: str, msg_type: str) -> Verdict:
    """Perform the faults that fire on this message; the runtime calls it before each handler.

    Args:
        plan: the process's fault plan.
        actor_name: the actor about to handle the message.
        msg_type: the message's type.

    Returns:
        ``DROP`` if the message is to be lost (not handled, not answered), else ``PROCEED``.

    Raises:
        FaultInjected: a ``crash`` fault fired; let it propagate as the handler's error.
    """
    if not plan.active:
        return PROCEED
    for spec in plan.next_faults(actor_name, msg_type):
        log.warning(
            "fault_injected",
            kind=spec.kind.value,
            actor=actor_name,
            message_type=msg_type,
            seconds=spec.seconds,
        )
        if spec.kind is FaultKind.KILL:
            kill_process()
        elif spec.kind is FaultKind.CRASH:
            crash(actor_name, msg_type)
        elif spec.kind is FaultKind.HANG_WITH_GIL:
            assert spec.seconds is not None
            hang_with_gil(spec.seconds)
        elif spec.kind is FaultKind.STALL:
            plan.stall(spec.seconds)
        elif spec.kind is FaultKind.SLOW:
            assert spec.seconds is not None
            slow(spec.seconds)
        elif spec.kind is FaultKind.DROP:
            return DROP
    return PROCEED
