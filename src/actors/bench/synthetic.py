"""Synthetic stages with configured costs: to measure the pipeline engine itself, and to test it."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from troupe.runtime.errors import ItemFailed
from troupe.runtime.pipeline.stage import StageActor

__all__ = ["CostStage"]


class CostStage(StageActor):
    """Spends ``cost_s`` per item, then passes the item on with its payload.

    Args:
        cost_s: seconds per item.
        busy: burn CPU for the cost (True) or sleep it (False: isolates the engine's overhead).
        payload_kb: size of a numpy payload to attach to each output item.
        prune_every: prune items whose seed is divisible by this (0: never).
        fail_first: error (not prune) on the first attempt at items whose seed is divisible by
            this (0: never); the engine's retry then succeeds.
    """

    def __init__(
        self,
        cost_s: float = 0.01,
        busy: bool = False,
        payload_kb: int = 0,
        prune_every: int = 0,
        fail_first: int = 0,
    ) -> None:
        self.cost_s = cost_s
        self.busy = busy
        self.payload = np.zeros(payload_kb * 128, dtype=np.float64) if payload_kb else None
        self.prune_every = prune_every
        self.fail_first = fail_first
        self.seen: set[int] = set()

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        seed = int(item["seed"])
        if self.prune_every and seed % self.prune_every == 0:
            raise ItemFailed(f"seed {seed} is pruned by configuration")
        if self.fail_first and seed % self.fail_first == 0 and seed not in self.seen:
            self.seen.add(seed)
            raise OSError(28, f"simulated disk full on the first attempt at seed {seed}")
        if self.busy:
            end = time.perf_counter() + self.cost_s
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(self.cost_s)
        out = {"task_id": item["task_id"], "seed": seed}
        if self.payload is not None:
            out["payload"] = self.payload
        return out
