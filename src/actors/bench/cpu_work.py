"""A CPU-bound synthetic pipeline: plan (pure Python, holds the GIL), render (numpy), store
(write + fsync). Real work sized by counts, not sleeps, so that the pipeline competes for the
cores as a real one does; ``troupe bench pipeline`` measures each stage's cost alone and
compares the pipeline's throughput with the bound those costs allow on this machine.
"""

from __future__ import annotations

import hashlib
import os
import random
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from troupe.runtime.pipeline.stage import StageActor

__all__ = ["CpuPlan", "CpuRender", "CpuStore", "isolated_costs", "plan_work", "render_work", "store_work"]


def plan_work(seed: int, steps: int) -> list[float]:
    """A random walk with a greedy choice at each step: Python arithmetic, no numpy."""
    rng = random.Random(seed)
    x = y = 0.0
    path = []
    for _ in range(steps):
        best, best_d = (0.0, 0.0), float("inf")
        for _ in range(4):
            dx, dy = rng.uniform(-1, 1), rng.uniform(-1, 1)
            d = (x + dx - 10.0) ** 2 + (y + dy - 10.0) ** 2
            if d < best_d:
                best, best_d = (dx, dy), d
        x, y = x + best[0], y + best[1]
        path.append(x)
    return path[:: max(1, steps // 16)]


def render_work(seed: int, pixels: int, passes: int) -> np.ndarray:
    """Shade an image of ``pixels`` float32 values ``passes`` times; return a small summary."""
    rng = np.random.default_rng(seed)
    img = rng.random(pixels, dtype=np.float32)
    for k in range(passes):
        img = np.sqrt(img * img + np.float32(0.5)) * np.float32(0.7) + np.sin(img + np.float32(k))
    return np.asarray(img[:: max(1, pixels // 1024)], dtype=np.float32).copy()


def store_work(directory: Path, data: bytes, rounds: int = 4) -> int:
    """Checksum ``data`` ``rounds`` times, write it to a new file with its checksum and fsync
    it, as a commit does; return the bytes written."""
    digest = b""
    for _ in range(rounds):
        digest = hashlib.sha256(digest + data).digest()
    path = directory / f"{uuid.uuid4().hex}.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, digest)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    path.unlink()  # only the cost is wanted, not the disk space
    return len(data)


class CpuPlan(StageActor):
    """Plan: ``steps`` steps of a Python random walk per item."""

    def __init__(self, steps: int = 5000) -> None:
        self.steps = steps

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        return {
            "task_id": item["task_id"],
            "seed": item["seed"],
            "path": plan_work(int(item["seed"]), self.steps),
        }


class CpuRender(StageActor):
    """Render: ``passes`` numpy passes over ``pixels`` values per item."""

    def __init__(self, pixels: int = 32768, passes: int = 280) -> None:
        self.pixels = pixels
        self.passes = passes

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        image = render_work(int(item["seed"]), self.pixels, self.passes)
        return {"task_id": item["task_id"], "seed": item["seed"], "image": image}


class CpuStore(StageActor):
    """Store: checksum ``kib`` KiB ``rounds`` times, write them under ``directory`` and fsync."""

    def __init__(self, directory: str, kib: int = 512, rounds: int = 8) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.data = os.urandom(kib * 1024)
        self.rounds = rounds

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"task_id": item["task_id"], "bytes": store_work(self.directory, self.data, self.rounds)}


def isolated_costs(directory: str, reps: int = 40) -> dict[str, float]:
    """Each stage's seconds per item with its default settings, alone in this process (median
    of ``reps``): what the pipeline's bound is computed from."""
    plan, render, store = CpuPlan(), CpuRender(), CpuStore(directory)
    costs: dict[str, list[float]] = {"plan": [], "render": [], "store": []}
    for i in range(reps):
        item: dict[str, Any] = {"task_id": f"iso-{i}", "seed": i, "attempt": 0}
        for name, stage in (("plan", plan), ("render", render), ("store", store)):
            t0 = time.perf_counter()
            item = stage.process(item)
            costs[name].append(time.perf_counter() - t0)
    return {name: statistics.median(times) for name, times in costs.items()}
