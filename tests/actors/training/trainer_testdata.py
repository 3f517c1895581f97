"""Tiny training data and configs for the trainer tests (tests/actors/training/test_trainer_*.py).

:func:`write_clips` commits a few short episodes into a run folder's episode store (what
``LeRobotClips`` reads in store mode). :class:`GatedClips` is ``LeRobotClips`` that, in a process
whose ``TROUPE_TEST_GATE`` names a file, stops reading after ``TROUPE_TEST_GATE_AFTER`` clips
until that file exists: a trainer worker then waits at a known step, deterministically, for a
test to kill it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from support.encoder_workers import LIGHT_ENCODER, encoder_worker
from troupe.actors.lerobot.episode import EpisodeData, write_episode
from troupe.actors.training.dataset import LeRobotClips, store_dir
from troupe.runtime.tasks.output_store import OutputStore

GATED = "trainer_testdata:GatedClips"
WAIT_S = 90.0
EPISODES, LENGTH, SIDE, FPS = 3, 16, 32, 10


def write_clips(root: Path, episodes: int = EPISODES, length: int = LENGTH) -> Path:
    """Commit ``episodes`` seeded episodes of ``length`` frames under ``root``; returns ``root``."""
    store = OutputStore(store_dir(root), durable=False)
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    for e in range(episodes):
        rgb = np.empty((length, SIDE, SIDE, 3), dtype=np.uint8)
        for i in range(length):
            rgb[i, ..., 0] = (x * 5 + i * 9 + e * 30) % 256
            rgb[i, ..., 1] = (y * 5 + e * 40) % 256
            rgb[i, ..., 2] = 60 + e * 50
        rng = np.random.default_rng(e)
        write_episode(
            store,
            EpisodeData(
                task_id=f"ep-{e}",
                task="navigate to the goal",
                fps=FPS,
                rgb=rgb,
                depth=np.full((length, SIDE, SIDE), 2.0, dtype=np.float32),
                ego=rng.normal(size=(length, 9)).astype(np.float32),
            ),
        )
    return root


def train_data(dataset: Path, steps: int, **train: Any) -> dict[str, Any]:
    """A train config as JSON data: 4-frame 16x16 clips, the light encoder, a 1-layer model."""
    return {
        "train": {
            "dataset": str(dataset), "steps": steps, "batch_size": 2, "clip_frames": 4,
            "size": [16, 16], "lr": 1e-3, "warmup_steps": 1, "seed": 3, "inflight": 2,
            "group_size": 1, "checkpoint_every": 2, "deadline_s": 60.0, **train,
        },
        "model": {"d_model": 32, "layers": 1, "heads": 2, "latent_channels": 4, "patch_size": 2},
        "encoders": {"encoder": LIGHT_ENCODER, "encoder_kwargs": {"seed": 3}},
        "trainers": {"threads": 1},
    }  # fmt: skip


SUPERVISION = """
[supervision]
heartbeat_timeout_s = 30.0  # as the run driver sets for trainers: a loaded machine is no failure
progress_timeout_s = 0.0
"""


def node_config(*workers: str) -> str:
    """A test node's config: the trainer supervision settings, then ``workers``."""
    return SUPERVISION + "".join(workers)


def trainer_encoder(name: str) -> str:
    """A worker table of the encoder actor ``name`` for the trainer tests: no disk cache, 1 thread."""
    return encoder_worker(name, disk_mb=0, threads=1)


TRAINER_WORKER = """
[[workers]]
name = "w-{name}"

[[workers.actors]]
name = "{name}"
class = "troupe.actors.training.trainer:TrainerActor"
kwargs = {{ threads = 1 }}
"""


class GatedClips(LeRobotClips):
    """``LeRobotClips`` whose reads stop after a number of clips until a gate file exists."""

    read_count = 0  # per process

    def read(self, i: int, source: Any, frame: int) -> dict[str, Any]:
        gate = os.environ.get("TROUPE_TEST_GATE")
        if gate:
            GatedClips.read_count += 1
            if GatedClips.read_count > int(os.environ.get("TROUPE_TEST_GATE_AFTER", "0")):
                while not os.path.exists(gate):  # the test kills this process meanwhile
                    time.sleep(0.05)
        return super().read(i, source, frame)


async def wait_progress(
    ref: Any, until: Callable[[dict[str, Any]], bool], timeout: float = WAIT_S
) -> dict[str, Any]:
    """Poll ``progress`` until ``until`` holds (bounded); a failed run fails the test at once."""
    with anyio.fail_after(timeout):
        while True:
            progress: dict[str, Any] = await ref.ask("progress", timeout=30)
            if until(progress):
                return progress
            assert progress["state"] != "failed", progress["error"]
            await anyio.sleep(0.05)
