"""What a training run reports: :class:`TrainProgress` at every poll, :class:`TrainRunResult` at
the end, :class:`TrainingFailed` when it cannot go on; and the figures read off the ranks'
answers and the checkpoint folder for the result."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from troupe.runtime import TroupeError

__all__ = [
    "TrainProgress",
    "TrainRunResult",
    "TrainingFailed",
    "committed_checkpoints",
    "committed_steps",
    "rank_timings",
]

_STEP_DIR = re.compile(r"step-(\d+)")  # a checkpoint's folder (checkpoint.py, which imports torch)


class TrainingFailed(TroupeError):
    """The ranks failed more often than ``train.max_restarts`` allows, or a rank could not start."""


@dataclass(frozen=True)
class TrainProgress:
    """What ``on_progress`` is told at every poll (rank 0's figures)."""

    step: int
    steps: int
    loss: float | None
    samples_per_s: float
    checkpoint: int | None  # the step of the last committed checkpoint
    restarts: int
    states: tuple[str, ...]
    resumed_from: int | None = None  # an earlier run's step this run resumed from: a bar starts there


@dataclass
class TrainRunResult:
    """What a training run did.

    Attributes:
        steps: the step reached (rank 0's last), counting the steps of an earlier run this one
            resumed from; :attr:`steps_this_run` is this run's count.
        losses: the loss per step of the last (re)start, the mean of the ranks' (each records
            it): steps ``first_step + 1`` on (a restart or a rerun continues from the last
            committed checkpoint).
        loss: the last loss.
        samples_per_s: samples per second over all ranks.
        timings: per rank, ``read_s``, ``wait_s``, ``train_s``.
        requests: sample groups each encoder actor answered.
        restarts: times the ranks were started again.
        checkpoints: the committed checkpoint folders, oldest first.
        placement: actor name -> node name.
        wall_s: seconds from the call to the end.
        resumed_from: the step of an earlier run's checkpoint this run resumed from, or None.
        first_step: the step the last (re)start resumed from (0 when it started afresh).
        datagen: the data generation run's figures, when it ran beside.
        latent_cache: the encoder actors' latent cache figures, summed over them
            (:func:`~.encoder_figures.latent_cache_figures`); None without encoder actors
            (``train.local_encoding``).
    """

    steps: int
    losses: list[float]
    loss: float | None
    samples_per_s: float
    timings: dict[str, dict[str, float]]
    requests: dict[str, int]
    restarts: int
    checkpoints: list[str]
    placement: dict[str, str]
    wall_s: float
    resumed_from: int | None = None
    first_step: int = 0
    datagen: dict[str, Any] | None = None
    latent_cache: dict[str, Any] | None = None

    @property
    def steps_this_run(self) -> int:
        """The steps this run took the training on: from ``resumed_from`` (or 0) to ``steps``."""
        return self.steps - (self.resumed_from or 0)

    def as_json(self) -> dict[str, Any]:
        """The result as JSON data (``troupe run --json``), ``steps_this_run`` included."""
        return {**asdict(self), "steps_this_run": self.steps_this_run}


def rank_timings(progress: dict[str, Any]) -> dict[str, float]:
    """A rank's ``read_s``, ``wait_s`` and ``train_s`` from its last ``progress`` answer."""
    t = progress.get("timings") or {}
    return {k: float(t.get(k) or 0.0) for k in ("read_s", "wait_s", "train_s")}


def committed_checkpoints(directory: Path) -> list[str]:
    """The committed checkpoint folders in ``directory``, oldest first."""
    from .checkpoint import COMMITTED

    if not directory.is_dir():
        return []
    return [str(p) for p in sorted(directory.glob("step-*")) if (p / COMMITTED).is_file()]


def committed_steps(directory: Path) -> list[int]:
    """The steps of the committed checkpoints in ``directory``, in order."""
    steps = (_STEP_DIR.fullmatch(Path(p).name) for p in committed_checkpoints(directory))
    return sorted(int(m.group(1)) for m in steps if m is not None)
