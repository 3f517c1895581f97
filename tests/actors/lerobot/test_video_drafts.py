"""The dataset's mp4s drafted as episodes commit (``video_drafts``): finalize takes a draft that
begins a file and writes the same bytes as without it; anything else is remuxed anew."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from support.file_digests import file_digests
from troupe.actors.lerobot.episode import EpisodeData, write_episode
from troupe.actors.lerobot.finalize import DatasetConfig, finalize_dataset
from troupe.actors.lerobot.video_drafts import LAG, VideoDrafts, clear_stale
from troupe.runtime.tasks.output_store import OutputStore

FPS = 10
EPISODES = LAG + 4  # LAG held back: the first four are drafted before finalize


def _episode(task_id: str, seed: int) -> EpisodeData:
    length = 3 + seed % 3
    frames = np.full((length, 16, 16, 3), 40 + 9 * seed, dtype=np.uint8)
    return EpisodeData(
        task_id=task_id,
        task="navigate to the goal",
        fps=FPS,
        rgb=frames,
        depth=np.full((length, 16, 16), 1.0 + seed / 4, dtype=np.float32),
        ego=np.zeros((length, 9), dtype=np.float32),
    )


@pytest.fixture
def store(tmp_path: Path) -> OutputStore:
    store = OutputStore(tmp_path / "store", durable=False)
    for seed in range(EPISODES):
        assert write_episode(store, _episode(f"ep-{seed:03d}", seed))
    return store


def _drafts(store: OutputStore, order: list[str]) -> VideoDrafts:
    drafts = VideoDrafts(store.root / ".video-drafts", 200 << 20)
    for task_id in order:
        drafts.committed(task_id, store.committed_path(task_id))
    drafts.settle(timeout_s=60)
    return drafts


def test_finalize_takes_the_drafts_and_writes_the_same_bytes(store: OutputStore, tmp_path: Path) -> None:
    drafts = _drafts(store, store.committed())
    try:
        assert sorted(p.name.split("-", 1)[1] for p in drafts.folder.iterdir()) == [
            "observation.images.depth-0.mp4",
            "observation.images.rgb-0.mp4",
        ]
        finalize_dataset(store, tmp_path / "drafted", DatasetConfig(fps=FPS), drafts)
        assert list(drafts.folder.iterdir()) == []  # both taken: moved into the dataset
    finally:
        drafts.close()
    finalize_dataset(store, tmp_path / "remuxed", DatasetConfig(fps=FPS))
    assert file_digests(tmp_path / "drafted") == file_digests(tmp_path / "remuxed")


def test_an_episode_committed_before_one_drafted_ends_drafting_and_changes_nothing(
    store: OutputStore, tmp_path: Path
) -> None:
    """ep-000 committed last (a retried item): the drafts, which began at ep-001, are no file's
    beginning; finalize remuxes every file from the episodes, and the drafts are deleted."""
    ids = store.committed()
    drafts = _drafts(store, [*ids[1:], ids[0]])
    try:
        finalize_dataset(store, tmp_path / "drafted", DatasetConfig(fps=FPS), drafts)
        assert len(list(drafts.folder.iterdir())) == 2  # not taken
    finally:
        drafts.close()
    assert list(drafts.folder.iterdir()) == []
    finalize_dataset(store, tmp_path / "remuxed", DatasetConfig(fps=FPS))
    assert file_digests(tmp_path / "drafted") == file_digests(tmp_path / "remuxed")


def test_a_file_size_limit_starts_a_new_draft_as_finalize_starts_a_new_file(
    store: OutputStore, tmp_path: Path
) -> None:
    """Finalize's files of at most ``video_files_size_in_mb``: the drafts close theirs at the same
    episode, and the dataset is the same with them."""
    sizes = [
        (store.committed_path(t) / "observation.images.rgb.mp4").stat().st_size for t in store.committed()
    ]
    limit = sum(sizes[:2])  # two episodes a file (rgb; depth's files are split where theirs fill)
    drafts = VideoDrafts(store.root / ".video-drafts", limit)
    for task_id in store.committed():
        drafts.committed(task_id, store.committed_path(task_id))
    drafts.settle(timeout_s=60)
    config = DatasetConfig(fps=FPS, video_files_size_in_mb=limit / (1 << 20))
    try:
        finalize_dataset(store, tmp_path / "drafted", config, drafts)
        assert list(drafts.folder.iterdir()) == []  # each whole draft, and the open one, taken
    finally:
        drafts.close()
    finalize_dataset(store, tmp_path / "remuxed", config)
    assert file_digests(tmp_path / "drafted") == file_digests(tmp_path / "remuxed")
    assert len(list((tmp_path / "remuxed" / "videos" / "observation.images.rgb").rglob("*.mp4"))) > 1


def test_the_drafts_of_a_process_gone_are_deleted_and_a_live_ones_kept(tmp_path: Path) -> None:
    gone = tmp_path / "999999999-observation.images.rgb-0.mp4"  # past any pid_max
    live = tmp_path / f"{os.getppid()}-observation.images.rgb-0.mp4"
    gone.write_bytes(b"draft")
    live.write_bytes(b"draft")
    clear_stale(tmp_path)
    assert not gone.exists() and live.exists()
