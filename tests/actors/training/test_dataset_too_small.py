"""A dataset too small for the run, once it is finalized, cannot grow: the rank's failure is final
and the driver does not restart for it (every restart failed the same way, three of them by
default, before). A run's folder that may still grow keeps its retries
(``test_dataset_clips.py``: ``NotEnoughEpisodes.final``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trainer_testdata import train_data, wait_progress, write_clips

from support.clip_data import finalize
from troupe.actors.training.trainer import TrainerActor
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.transports.base import MemoryHub

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


async def _failed_rank(tmp_path: Path, length: int, **train: Any) -> dict[str, Any]:
    write_clips(tmp_path / "run", length=length)
    finalize(tmp_path / "run", tmp_path / "dataset")
    config = train_data(tmp_path / "dataset", 2, local_encoding=True)
    config["train"].update(train)
    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:
        rank = await runtime.spawn(TrainerActor(threads=1), "trainer")
        await rank.ask("start", {"config": config, "out": str(tmp_path / "out"), "rank": 0, "world_size": 1})
        return await wait_progress(rank, lambda p: p["state"] == "failed")


async def test_episodes_shorter_than_a_clip_fail_the_rank_for_good(tmp_path: Path) -> None:
    failed = await _failed_rank(tmp_path, length=6, clip_frames=8)
    assert failed["final"] is True
    assert "NotEnoughEpisodes" in failed["error"] and "0 episodes of at least 8 frames" in failed["error"]


async def test_a_batch_bigger_than_the_dataset_fails_the_rank_for_good(tmp_path: Path) -> None:
    failed = await _failed_rank(tmp_path, length=8, clip_frames=4, batch_size=64)
    assert failed["final"] is True
    assert "TooFewClips: the dataset has 6 clips, fewer than one step needs" in failed["error"]
