"""One trainer rank's run as the trainer actor knows it: the validated ``start`` request
(:class:`StartRequest`) and what the run did so far (:class:`RankRun`, read by ``progress``)."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio

from troupe.runtime import ConfigError

from .checkpoint import latest
from .inflight import StageTimings, TrainResult
from .train_config import TrainConfig, load_train_config

__all__ = ["RankRun", "StartRequest", "committed_step"]


@dataclass(frozen=True)
class StartRequest:
    """A validated ``start`` payload."""

    config: TrainConfig
    out: str
    rank: int
    world_size: int
    encoders: tuple[str, ...]
    rendezvous: str
    host: str = "127.0.0.1"

    @classmethod
    def parse(cls, payload: Any) -> StartRequest:
        """Raises ConfigError naming the missing or bad field."""
        if not isinstance(payload, dict):
            raise ConfigError(f"start: expected a map payload, got {type(payload).__name__}")
        for key in ("config", "out", "rank", "world_size"):
            if key not in payload:
                raise ConfigError(f"start: missing {key!r}")
        out = payload["out"]
        if not isinstance(out, str) or not out:
            raise ConfigError(f"start: out={out!r}: expected a folder path")
        config = load_train_config(payload["config"]).with_out(out)
        world_size, rank = payload["world_size"], payload["rank"]
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ConfigError(f"start: world_size={world_size!r}: expected an integer >= 1")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
            raise ConfigError(f"start: rank={rank!r}: expected 0..{world_size - 1}")
        encoders = payload.get("encoders") or []
        if not isinstance(encoders, list | tuple) or not all(isinstance(e, str) and e for e in encoders):
            raise ConfigError(f"start: encoders={encoders!r}: expected a list of actor names")
        if not config.train.local_encoding and not encoders:
            raise ConfigError("start: encoders=[]: give encoder actors, or set train.local_encoding = true")
        rendezvous = payload.get("rendezvous") or "trainer-rendezvous"
        host = payload.get("host") or "127.0.0.1"
        if not isinstance(rendezvous, str) or not isinstance(host, str):
            raise ConfigError(f"start: rendezvous={rendezvous!r}, host={host!r}: expected strings")
        return cls(config, out, rank, world_size, tuple(encoders), rendezvous, host)


@dataclass
class RankRun:
    """What one run of this rank did so far (read by ``progress``)."""

    request: StartRequest
    state: str = "starting"
    step: int = 0
    start_step: int = 0
    resumed_from: int | None = None
    losses: list[float] = field(default_factory=list)
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    timings: StageTimings = field(default_factory=StageTimings)
    result: TrainResult | None = None
    error: str | None = None
    error_final: bool = (
        False  # the error would come back after any restart (LossNotFinite, a finalized dataset too small)
    )
    final: dict[str, Any] | None = None
    note: str | None = None  # what the user should know of this run (its LR schedule extended)
    stop: threading.Event = field(default_factory=threading.Event)
    scope: anyio.CancelScope | None = None
    started_at: float = field(default_factory=time.perf_counter)
    ended: anyio.Event = field(default_factory=anyio.Event)


def committed_step(directory: str) -> int | None:
    """The step of the newest committed checkpoint in ``directory``, or None."""
    found = latest(directory)
    return int(found.name.split("-")[1]) if found is not None else None
