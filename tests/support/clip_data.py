"""Tiny LeRobot data for the clip dataset and VAE training tests: episodes written with the
real episode writer (H.264 mp4s, parquet rows) into a run folder's store, and finalized."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from troupe.actors.lerobot.action_layout import ACTION_DIM
from troupe.actors.lerobot.episode import EpisodeData, write_episode
from troupe.actors.lerobot.finalize import DatasetConfig, finalize_dataset
from troupe.actors.training.dataset import store_dir
from troupe.runtime.tasks.output_store import OutputStore

FPS = 10
HEIGHT, WIDTH = 32, 48


def episode(task_id: str, length: int, seed: int) -> EpisodeData:
    """A smooth moving pattern (H.264 keeps it nearly lossless), random actions and mask."""
    rng = np.random.default_rng(seed)
    t = np.arange(length)[:, None, None]
    y = np.arange(HEIGHT)[None, :, None]
    x = np.arange(WIDTH)[None, None, :]
    phase = rng.uniform(0, 2 * np.pi, 3)
    rgb = np.stack([127 + 100 * np.sin(0.07 * x + 0.05 * y + 0.3 * t + p) for p in phase], axis=-1).astype(
        np.uint8
    )
    depth = np.broadcast_to(1.0 + 0.05 * x + 0.0 * t + 0.0 * y, (length, HEIGHT, WIDTH)).astype(np.float32)
    ego = rng.normal(size=(length, 9)).astype(np.float32)
    actions = rng.normal(size=(length, ACTION_DIM)).astype(np.float32)
    mask = rng.random((length, ACTION_DIM)) > 0.4
    return EpisodeData(task_id, "navigate", FPS, rgb, depth, ego, actions=actions, action_mask=mask)


def write_run(root: Path, lengths: dict[str, int]) -> dict[str, EpisodeData]:
    """Commit one episode per task id into ``root`` as a run folder; return them."""
    store = OutputStore(store_dir(root))
    episodes = {}
    for seed, (task_id, length) in enumerate(sorted(lengths.items())):
        ep = episode(task_id, length, seed)
        write_episode(store, ep)
        episodes[task_id] = ep
    return episodes


def finalize(run: Path, dest: Path) -> None:
    """Write the run's committed episodes as a finalized LeRobot dataset at ``dest``."""
    finalize_dataset(OutputStore(store_dir(run)), dest, DatasetConfig(fps=FPS))


def generated_run(out: Path, items: int) -> Path:
    """Run the default data generation pipeline for ``items`` items into ``out``."""
    from troupe.actors.datagen.config import default_pipeline
    from troupe.runtime.pipeline.runner import run_pipeline_sync

    run_pipeline_sync(default_pipeline(), out=out, items=items)
    return out
