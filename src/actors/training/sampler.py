"""A sampler that resumes exactly on any number of ranks.

:class:`ResumableSampler` draws an infinite stream of seeded epochs and shards each step's
``world_size * batch_size`` positions across ranks; its state (:meth:`ResumableSampler.state_at`)
is global, so a run saved by W ranks resumes on any other number, and a dataset that grows between
epochs (a run still writing) is picked up at the next epoch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["ResumableSampler", "TooFewClips"]


def _epoch_perm(n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


class TooFewClips(ValueError):
    """The dataset holds fewer clips than one step of every rank needs."""


@dataclass(frozen=True)
class _EpochMark:
    step: int  # steps generated (since the iterator started) when this epoch's first step came
    epoch: int
    offset: int  # the epoch's position at that step
    size: int  # clips in this epoch's permutation
    base: int  # global position of the epoch's position 0


class ResumableSampler(torch.utils.data.Sampler[int]):
    """An infinite stream of seeded epochs of clip indices, sharded over ranks, resumable.

    Epoch ``e`` is a permutation of ``range(n_e)`` seeded by ``(seed, e)`` (``0..n_e-1`` without
    shuffle), ``n_e`` the dataset's length when the epoch starts (``dataset.refresh()`` is called
    then, so a growing store is picked up). Positions are global: a step consumes ``world_size *
    batch_size`` positions and rank ``r`` takes ``perm[pos + r*B : pos + (r+1)*B]``; an epoch's
    tail shorter than a step is skipped (every step has full batches on every rank).

    Args:
        dataset: a :class:`LeRobotClips` (anything with ``__len__`` and ``refresh()``).
        batch_size: clips per rank per step.
        seed: seeds every epoch's permutation.
        shuffle: permute each epoch (else in order).
        rank, world_size: this rank and the number of ranks.
        start: where to resume: the dict :meth:`state_at` returned (exact in every case), or its
            ``"start"`` alone (the global position; exact when the dataset has not grown since).

    Raises:
        ValueError: bad batch_size, rank or world_size, or a state of another seed.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        start: int | Mapping[str, Any] = 0,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"ResumableSampler batch_size={batch_size!r}: expected a positive integer")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"ResumableSampler rank={rank}, world_size={world_size}: need 0 <= rank < world_size"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        if isinstance(start, Mapping):
            if int(start.get("seed", seed)) != seed:
                raise ValueError(f"ResumableSampler: the state is of seed {start['seed']}, not {seed}")
            self._resume: dict[str, int] | int = {
                k: int(start[k]) for k in ("start", "epoch", "offset", "epoch_size", "epoch_base")
            }
        else:
            if isinstance(start, bool) or int(start) < 0:
                raise ValueError(f"ResumableSampler start={start!r}: expected a position >= 0")
            self._resume = int(start)
        self._marks: list[_EpochMark] = []

    @property
    def step_size(self) -> int:
        """Global positions one step consumes: ``world_size * batch_size``."""
        return self.world_size * self.batch_size

    def _first_epoch(self) -> tuple[int, int, int, int]:
        """(epoch, offset, size, base) where the stream resumes."""
        n = self.dataset.refresh()
        if isinstance(self._resume, dict):
            r = self._resume
            return r["epoch"], r["offset"], r["epoch_size"], r["epoch_base"]
        if n < self.step_size:
            return 0, 0, n, 0
        epoch, offset = divmod(self._resume, n)
        return epoch, offset, n, epoch * n

    def __iter__(self) -> Iterator[int]:
        self._marks = []
        step = 0
        epoch, offset, size, base = self._first_epoch()
        first = True
        while True:
            if not first:
                size = self.dataset.refresh()
            first = False
            if size < self.step_size:
                raise TooFewClips(
                    f"the dataset has {size} clips, fewer than one step needs "
                    f"(world_size {self.world_size} x batch_size {self.batch_size})"
                )
            perm = _epoch_perm(size, self.seed, epoch, self.shuffle)
            self._marks.append(_EpochMark(step, epoch, offset, size, base))
            while offset + self.step_size <= size:
                lo = offset + self.rank * self.batch_size
                yield from perm[lo : lo + self.batch_size].tolist()
                offset += self.step_size
                step += 1
            epoch, offset, base = epoch + 1, 0, base + size

    def state_at(self, steps_done: int) -> dict[str, int]:
        """What a checkpoint stores after ``steps_done`` steps of this iterator were trained on.

        The DataLoader reads ahead, so pass the steps trained, not how far iteration went.
        """
        if not self._marks:
            epoch, offset, size, base = self._first_epoch()
            mark = _EpochMark(0, epoch, offset, size, base)
            if steps_done:
                raise ValueError(f"state_at({steps_done}): the sampler has not been iterated")
        else:
            k = bisect.bisect_right([m.step for m in self._marks], steps_done) - 1
            mark = self._marks[max(k, 0)]
        offset = mark.offset + (steps_done - mark.step) * self.step_size
        epoch, base, size = mark.epoch, mark.base, mark.size
        if offset + self.step_size > size:
            # The steps filled the epoch: the next step starts the next one.
            epoch, offset, base, size = epoch + 1, 0, base + size, max(size, len(self.dataset))
        return {
            "start": base + offset,
            "seed": self.seed,
            "epoch": epoch,
            "offset": offset,
            "epoch_size": size,
            "epoch_base": base,
        }
