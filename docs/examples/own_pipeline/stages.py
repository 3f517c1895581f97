"""The stages of a small pipeline: make a noisy signal, smooth it, store it."""

import json
import os
from pathlib import Path

import numpy as np

from troupe import ItemFailed, StageActor, StageRun


class Generate(StageActor):
    """A noisy sine per item, from the item's seed (same seed, same signal)."""

    def __init__(self, samples: int = 4096):
        self.samples = samples

    def process(self, item):
        rng = np.random.default_rng(item["seed"])
        t = np.linspace(0, 1, self.samples, dtype=np.float32)
        signal = np.sin(2 * np.pi * rng.uniform(1, 20) * t) + rng.normal(0, 0.5, self.samples)
        return {"task_id": item["task_id"], "signal": signal.astype(np.float32)}


class Smooth(StageActor):
    """A moving average; a signal too flat to be worth keeping is pruned."""

    def __init__(self, window: int = 32):
        self.kernel = np.ones(window, dtype=np.float32) / window

    def process(self, item):
        smooth = np.convolve(item["signal"], self.kernel, mode="same")
        if smooth.std() < 0.05:
            raise ItemFailed(f"{item['task_id']}: flat signal")
        return {"task_id": item["task_id"], "smooth": smooth}


class Store(StageActor):
    """One .npy per item, written once (a rerun keeps what is there, --fresh drops it); an index
    at the end."""

    def __init__(self, directory: str):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def start(self, run: StageRun):
        for leftover in self.directory.glob("*.tmp"):  # a replica killed mid-write
            leftover.unlink()
        if run.fresh:  # the run starts anew: what earlier runs stored goes too
            for old in self.directory.glob("*.npy"):
                old.unlink()
        return [p.stem for p in self.directory.glob("*.npy")]  # these items are kept

    def process(self, item):
        path = self.directory / f"{item['task_id']}.npy"
        with open(path.with_suffix(".tmp"), "wb") as f:
            np.save(f, item["smooth"])
            f.flush()
            os.fsync(f.fileno())
        os.replace(path.with_suffix(".tmp"), path)  # all or nothing
        return {"task_id": item["task_id"], "bytes": path.stat().st_size}

    def finalize(self, run: StageRun):
        stored = sorted(p.stem for p in self.directory.glob("*.npy"))
        index = self.directory / "index.json"
        index.write_text(json.dumps({"pipeline": run.pipeline, "items": stored}))
        return {"summary": f"{len(stored)} signals in {self.directory}", "outputs": [str(index)]}
