"""Failures that every restart would repeat are final: the driver does not restart for them (it
used up train.max_restarts, three by default, failing the same way each time). A dataset too
small for the run once it is finalized (it cannot grow; a run's folder that may still grow keeps
its retries: ``test_dataset_clips.py``), a last checkpoint that is damaged, and a file of the
dataset that does not read (a video or a parquet cut short), and a checkpoint save on a full
disk (each restart trained to the same save and failed there again). A loss that is not
finite: ``test_loss_not_finite.py``."""

from __future__ import annotations

import errno
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from trainer_testdata import train_data, wait_progress, write_clips

from support.clip_data import finalize
from troupe.actors.training import checkpoint
from troupe.actors.training.checkpoint import checkpoint_path
from troupe.actors.training.trainer import TrainerActor
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.tasks.journal_lock import JournalLock
from troupe.runtime.transports.base import MemoryHub

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


async def _rank_until(tmp_path: Path, config: dict[str, Any], state: str) -> dict[str, Any]:
    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:
        rank = await runtime.spawn(TrainerActor(threads=1), "trainer")
        await rank.ask("start", {"config": config, "out": str(tmp_path / "out"), "rank": 0, "world_size": 1})
        return await wait_progress(rank, lambda p: p["state"] == state)


def _dataset(tmp_path: Path, length: int) -> Path:
    write_clips(tmp_path / "run", length=length)
    finalize(tmp_path / "run", tmp_path / "dataset")
    return tmp_path / "dataset"


async def test_episodes_shorter_than_a_clip_fail_the_rank_for_good(tmp_path: Path) -> None:
    config = train_data(_dataset(tmp_path, 6), 2, local_encoding=True, clip_frames=8)
    failed = await _rank_until(tmp_path, config, "failed")
    assert failed["final"] is True
    assert "NotEnoughEpisodes" in failed["error"] and "0 episodes of at least 8 frames" in failed["error"]


async def test_a_batch_bigger_than_the_dataset_fails_the_rank_for_good(tmp_path: Path) -> None:
    config = train_data(_dataset(tmp_path, 8), 2, local_encoding=True, batch_size=64)
    failed = await _rank_until(tmp_path, config, "failed")
    assert failed["final"] is True
    assert "TooFewClips: the dataset has 6 clips, fewer than one step needs" in failed["error"]


async def test_a_damaged_last_checkpoint_fails_the_rank_for_good(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path, 8)
    await _rank_until(tmp_path, train_data(dataset, 2, local_encoding=True), "done")
    for part in checkpoint_path(tmp_path / "out" / "checkpoints", 2).glob("*.distcp"):
        part.write_bytes(b"\x00" * 64)
    failed = await _rank_until(tmp_path, train_data(dataset, 4, local_encoding=True), "failed")
    assert failed["final"] is True
    assert "CheckpointUnreadable" in failed["error"] and "step-000000002' cannot be loaded" in failed["error"]


async def test_a_checkpoint_of_another_model_fails_the_rank_for_good_saying_so(tmp_path: Path) -> None:
    """Report lc 3: not "move it away to resume from the one before", which every checkpoint of
    the other model fails the same way."""
    dataset = _dataset(tmp_path, 8)
    await _rank_until(tmp_path, train_data(dataset, 2, local_encoding=True), "done")
    other = train_data(dataset, 4, local_encoding=True)
    other["model"]["mlp_ratio"] = 2.0  # as another troupe's default would build it
    failed = await _rank_until(tmp_path, other, "failed")
    assert failed["final"] is True
    assert "step-000000002' was made with another model than this run builds" in failed["error"]
    assert "move it away" not in failed["error"], failed["error"]


async def test_a_video_of_the_dataset_cut_short_fails_the_rank_for_good(tmp_path: Path) -> None:
    """Every restart read the same bytes and failed the same way, three times over."""
    dataset = _dataset(tmp_path, 8)
    videos = sorted((dataset / "videos").rglob("*.mp4"))
    assert videos
    for video in videos:
        with video.open("r+b") as f:
            f.truncate(video.stat().st_size // 3)
    failed = await _rank_until(tmp_path, train_data(dataset, 2, local_encoding=True), "failed")
    assert failed["final"] is True
    assert "DatasetDamaged" in failed["error"], failed["error"]
    assert "the same command run again on its --out writes it again" in failed["error"]


async def test_a_parquet_of_the_dataset_cut_short_fails_the_rank_for_good(tmp_path: Path) -> None:
    """pyarrow's ArrowInvalid was restarted train.max_restarts times, then ended the run."""
    dataset = _dataset(tmp_path, 8)
    data = dataset / "data" / "chunk-000" / "file-000.parquet"
    with data.open("r+b") as f:
        f.truncate(data.stat().st_size // 2)
    failed = await _rank_until(tmp_path, train_data(dataset, 2, local_encoding=True), "failed")
    assert failed["final"] is True
    assert f"DatasetDamaged: {data} cannot be read" in failed["error"], failed["error"]


async def test_a_checkpoint_save_on_a_full_disk_fails_the_rank_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_space: Future[None] = Future()
    no_space.set_exception(OSError(errno.ENOSPC, "No space left on device"))
    monkeypatch.setattr(checkpoint, "async_save", lambda *a, **k: no_space)
    failed = await _rank_until(tmp_path, train_data(_dataset(tmp_path, 8), 2, local_encoding=True), "failed")
    assert failed["final"] is True
    assert "checkpoint save failed" in failed["error"] and "is full" in failed["error"], failed["error"]


async def test_too_few_clips_in_a_run_folder_nobody_writes_fail_the_rank_for_good(tmp_path: Path) -> None:
    """Its pipeline is not running (its journal's lock is free): the folder cannot grow, and three
    restarts burnt out in seconds on the same TooFewClips."""
    run = write_clips(tmp_path / "run", length=8)
    failed = await _rank_until(tmp_path, train_data(run, 2, local_encoding=True, batch_size=64), "failed")
    assert failed["final"] is True
    assert "TooFewClips: the dataset has 6 clips" in failed["error"], failed["error"]


async def test_too_few_clips_in_a_run_folder_being_written_may_pass(tmp_path: Path) -> None:
    run = write_clips(tmp_path / "run", length=8)
    held = JournalLock.acquire(RunDir(run).journal_path)  # a troupe run writing it
    try:
        config = train_data(run, 2, local_encoding=True, batch_size=64)
        failed = await _rank_until(tmp_path, config, "failed")
    finally:
        held.release()
    assert failed["final"] is False and "TooFewClips" in failed["error"], failed["error"]


async def test_a_checkpoint_resumed_on_a_dataset_that_shrank_fails_the_rank_for_good(tmp_path: Path) -> None:
    """The dataset made again with fewer clips: the checkpoint's sampler position is over clips
    that are not there. Each of three restarts failed on ``IndexError: clip index 21 out of
    range``; now the first says why, and nothing trains."""
    run = write_clips(tmp_path / "run", episodes=3, length=16)  # 12 clips of 4 frames
    await _rank_until(tmp_path, train_data(run, 2, local_encoding=True), "done")
    shutil.rmtree(run)
    write_clips(run, episodes=2, length=16)  # 8 clips
    failed = await _rank_until(tmp_path, train_data(run, 4, local_encoding=True), "failed")
    assert failed["final"] is True and failed["step"] == 2, failed
    assert f"ResumeMismatch: the dataset at {run} has 8 clips, the checkpoint at step 2" in failed["error"]
    assert "was trained on 12: it changed since" in failed["error"] and "--fresh" in failed["error"]


async def test_a_checkpoint_resumed_with_another_seed_fails_the_rank_for_good(tmp_path: Path) -> None:
    """Its sampler's epochs are the seed's: each restart failed on the same ValueError."""
    run = write_clips(tmp_path / "run")
    await _rank_until(tmp_path, train_data(run, 2, local_encoding=True), "done")
    failed = await _rank_until(tmp_path, train_data(run, 4, local_encoding=True, seed=7), "failed")
    assert failed["final"] is True, failed
    assert "was trained with train.seed=3, this run asks train.seed=7" in failed["error"], failed["error"]


async def test_a_dataset_not_on_the_ranks_host_fails_the_rank_for_good_naming_its_node(
    tmp_path: Path,
) -> None:
    """Report dt 3: the run's own check passed on its host; the rank's host had nothing at that
    path, and each of three restarts failed on a ValueError naming no host, advising to pass the
    folder `troupe run --out` wrote (it was that folder)."""
    absent = tmp_path / "dataset"
    absent.mkdir()  # as an empty mount there would look
    config = train_data(absent, 2, local_encoding=True)
    async with Runtime("host-b", "trainer", MemoryHub().transport()) as runtime:
        rank = await runtime.spawn(TrainerActor(threads=1), "trainer")
        await rank.ask("start", {"config": config, "out": str(tmp_path / "out"), "rank": 0, "world_size": 1})
        failed = await wait_progress(rank, lambda p: p["state"] == "failed")
    assert failed["final"] is True
    assert failed["error"] == (
        f"DatasetNotFound: node host-b has no dataset at train.dataset {absent} (neither "
        "meta/info.json nor .troupe/episodes there): every rank's host needs it at that same path "
        "(a shared file system, or a copy there)"
    )
