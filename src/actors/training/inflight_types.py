"""What one trainer rank's pipeline (:mod:`.inflight`) takes and gives: its settings
(:class:`InflightConfig`), the train step and encode function it is given, the sample groups it
sends, the errors after which a group goes to the next actor, and what a run did
(:class:`TrainResult`, :class:`StageTimings`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from troupe.runtime import ActorStopped, AskTimeout, MailboxFull, UnknownActor, Unreachable

__all__ = [
    "RETRYABLE",
    "EncodeFn",
    "GroupFailed",
    "InflightConfig",
    "SampleGroup",
    "StageTimings",
    "TrainResult",
    "TrainStep",
]

RETRYABLE: tuple[type[BaseException], ...] = (
    Unreachable,
    ActorStopped,
    UnknownActor,
    MailboxFull,
    AskTimeout,
    TimeoutError,
)
"""Errors after which a group is sent to the next actor: the actor, not the group, is at fault."""

TrainStep = Callable[[dict[str, Any]], Any]
"""``train_step(batch) -> loss``: the batch as read, with ``"latents"`` added; a float or 0-dim tensor."""


@dataclass(frozen=True)
class SampleGroup:
    """Group ``index`` of batch ``batch``: consecutive samples of its video, sent to one encoder."""

    batch: int
    index: int
    video: torch.Tensor

    @property
    def tag(self) -> tuple[int, int]:
        return (self.batch, self.index)


EncodeFn = Callable[[int, SampleGroup], Awaitable[torch.Tensor]]
"""``encode(actor_index, group) -> latents``: one ask to one encoder actor."""


class GroupFailed(RuntimeError):
    """A sample group could not be encoded by any actor: the run stops rather than train on a hole."""


@dataclass(frozen=True)
class InflightConfig:
    """Settings of one rank's pipeline.

    Attributes:
        inflight: K, the most batches read and not yet trained.
        group_size: samples per group sent to an encoder (the last group of a batch may be smaller).
        rank: this rank; the round-robin over the actors starts at ``rank % n_actors``.
        deadline_s: seconds one group may take on one actor before it goes to the next.
        max_steps: stop after this many train steps (None: when the batches run out).
        retry_after_s: seconds an actor is passed over after a failure before a group probes it.
        retry_after_max_s: the most that back-off grows to, doubling after each failed probe.
        probe_deadline_s: seconds a probe waits before its group goes on to the next actor; None:
            :func:`probe_wait_s` of the rank's recent answers.
    """

    inflight: int = 2
    group_size: int = 1
    rank: int = 0
    deadline_s: float = 60.0
    max_steps: int | None = None
    retry_after_s: float = 1.0
    retry_after_max_s: float = 30.0
    probe_deadline_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("inflight", "group_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"InflightConfig.{name}={value!r}: expected a positive integer")
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"InflightConfig.rank={self.rank!r}: expected an integer >= 0")
        if not self.deadline_s > 0:
            raise ValueError(f"InflightConfig.deadline_s={self.deadline_s!r}: expected a positive time")
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError(f"InflightConfig.max_steps={self.max_steps!r}: expected None or >= 0")
        if self.probe_deadline_s is not None and not self.probe_deadline_s > 0:
            raise ValueError(
                f"InflightConfig.probe_deadline_s={self.probe_deadline_s!r}: expected None or a positive time"
            )
        if not self.retry_after_s > 0:
            raise ValueError(f"InflightConfig.retry_after_s={self.retry_after_s!r}: expected a positive time")
        if not self.retry_after_max_s >= self.retry_after_s:
            raise ValueError(
                f"InflightConfig.retry_after_max_s={self.retry_after_max_s!r}: expected a time >= "
                f"retry_after_s ({self.retry_after_s!r})"
            )


@dataclass
class StageTimings:
    """Seconds spent per stage by the training side, and the rate it reached.

    ``read_s``: reading batches (the producer); ``wait_s``: the training loop waiting for a batch
    whose latents have not all come back; ``train_s``: in train steps; ``wall_s``: the whole run.
    With encoding hidden behind training, ``read_s`` and ``wait_s`` stay near zero.
    """

    read_s: float = 0.0
    wait_s: float = 0.0
    train_s: float = 0.0
    wall_s: float = 0.0
    steps: int = 0
    samples: int = 0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"read_s": self.read_s, "wait_s": self.wait_s, "train_s": self.train_s,
                "wall_s": self.wall_s, "steps": self.steps, "samples": self.samples,
                "samples_per_s": self.samples_per_s}  # fmt: skip


@dataclass
class TrainResult:
    """What a rank's run did: one loss per step, timings, and the asks each actor received."""

    losses: list[float] = field(default_factory=list)
    timings: StageTimings = field(default_factory=StageTimings)
    requests: list[int] = field(default_factory=list)
    """Asks sent to each actor (retries included); empty in local mode."""
    retries: int = 0
    """Groups sent again after an actor failed them."""
    skipped: list[int] = field(default_factory=list)
    """Groups the round robin did not send to each actor because it was backed off after a
    failure; empty in local mode."""
