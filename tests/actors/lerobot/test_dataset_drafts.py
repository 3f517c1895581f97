"""The dataset's files drafted as episodes commit (``dataset_drafts``): finalize takes a draft
that begins a file and writes the same bytes as without it; anything else is written anew."""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from support.file_digests import file_digests
from troupe.actors.lerobot import dataset_drafts
from troupe.actors.lerobot.dataset_drafts import LAG, DatasetDrafts, clear_stale
from troupe.actors.lerobot.episode import EpisodeData, write_episode
from troupe.actors.lerobot.errors import InvalidData
from troupe.actors.lerobot.finalize import DatasetConfig, finalize_dataset
from troupe.actors.lerobot.format import EPISODE_FILE, RGB_KEY, video_file
from troupe.runtime.tasks.output_store import OutputStore

FPS = 10
EPISODES = LAG + 4  # LAG held back: the first four are drafted before finalize
BIG = 200 << 20  # no file split


def _episode(task_id: str, seed: int) -> EpisodeData:
    length = 3 + seed % 3
    frames = np.full((length, 16, 16, 3), 40 + 9 * seed, dtype=np.uint8)
    return EpisodeData(
        task_id=task_id,
        task="navigate to the goal" if seed % 2 else "pick the cup",  # task indices from the order
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


def _drafts(
    store: OutputStore,
    order: list[str],
    video_limit: int = BIG,
    data_limit: int = BIG,
    items: list[str] | None = None,
) -> DatasetDrafts:
    drafts = DatasetDrafts(store.root / ".drafts", video_limit, data_limit)
    if items is not None:  # the run's items, as the writer's start hook tells them
        drafts.expect(items)
    for task_id in order:
        drafts.committed(task_id, store.committed_path(task_id))
    drafts.settle(timeout_s=60)
    return drafts


def _sizes(store: OutputStore, name: str) -> list[int]:
    return [(store.committed_path(t) / name).stat().st_size for t in store.committed()]


def test_finalize_takes_the_drafts_and_writes_the_same_bytes(store: OutputStore, tmp_path: Path) -> None:
    drafts = _drafts(store, store.committed())
    try:
        assert sorted(p.name.split("-", 1)[1] for p in drafts.folder.iterdir()) == [
            "data-0.parquet",
            "observation.images.depth-0.mp4",
            "observation.images.rgb-0.mp4",
        ]
        finalize_dataset(store, tmp_path / "drafted", DatasetConfig(fps=FPS), drafts)
        assert list(drafts.folder.iterdir()) == []  # all three taken: moved into the dataset
    finally:
        drafts.close()
    finalize_dataset(store, tmp_path / "written", DatasetConfig(fps=FPS))
    assert file_digests(tmp_path / "drafted") == file_digests(tmp_path / "written")


def _drafted_rgb(drafts: DatasetDrafts, store: OutputStore, task_ids: list[str]) -> list[str]:
    """The episodes in the first rgb draft (taken from the drafts: finalize remuxes that file)."""
    sources = [store.committed_path(t) / video_file(RGB_KEY) for t in task_ids]
    concat = drafts.take(RGB_KEY, 0, sources, FPS)
    assert concat is not None
    concat.discard()
    return [path.parent.name for path in concat.sources]


def test_told_the_runs_items_each_episode_is_drafted_once_those_before_it_are(
    store: OutputStore, tmp_path: Path
) -> None:
    """None is held back for finalize to add after the last item: ep-001, ending before ep-000,
    waits for it; the dataset is the same."""
    ids = store.committed()
    drafts = _drafts(store, [ids[1], ids[0], *ids[2:]], items=ids)
    try:
        assert _drafted_rgb(drafts, store, ids) == ids
        finalize_dataset(store, tmp_path / "drafted", DatasetConfig(fps=FPS), drafts)
    finally:
        drafts.close()
    finalize_dataset(store, tmp_path / "written", DatasetConfig(fps=FPS))
    assert file_digests(tmp_path / "drafted") == file_digests(tmp_path / "written")


def test_an_item_not_committed_holds_back_those_after_it_until_lag_newer_are_committed(
    store: OutputStore,
) -> None:
    """ep-002 not committed (it may still be, or it died): the ``LAG`` episodes after it wait for
    it; one more, and it is given up on, as without the run's items, and the rest are drafted."""
    ids = store.committed()
    after = [t for t in ids if t != ids[2]]
    for committed, drafted in ((after[:-1], ids[:2]), (after, after)):
        drafts = _drafts(store, committed, items=ids)
        try:
            assert _drafted_rgb(drafts, store, after) == drafted
        finally:
            drafts.close()


def test_the_drafts_are_synced_to_disk_as_their_episodes_are_added(
    store: OutputStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the drafts' own thread, each time ``SYNC_BYTES`` more are drafted (here at every
    episode): finalize's fsync of a draft, after the last item, had found the whole file still
    to write."""
    monkeypatch.setattr(dataset_drafts, "SYNC_BYTES", 1)
    synced: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def noting(fd: int) -> None:
        real_fsync(fd)
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), threading.current_thread().name))

    monkeypatch.setattr(os, "fsync", noting)
    ids = store.committed()
    drafts = _drafts(store, ids, items=ids)
    try:
        files = sorted(str(p) for p in drafts.folder.iterdir())
    finally:
        drafts.close()
    assert len(files) == 3
    assert Counter(file for file, _ in synced) == dict.fromkeys(files, len(ids))
    assert {thread.partition("_")[0] for _, thread in synced} == {"troupe-dataset-drafts"}


def test_an_episode_committed_before_one_drafted_ends_drafting_and_changes_nothing(
    store: OutputStore, tmp_path: Path
) -> None:
    """ep-000 committed last (a retried item): the drafts, which began at ep-001, are no file's
    beginning; finalize writes every file from the episodes, and the drafts are deleted."""
    ids = store.committed()
    drafts = _drafts(store, [*ids[1:], ids[0]])
    try:
        finalize_dataset(store, tmp_path / "drafted", DatasetConfig(fps=FPS), drafts)
        assert len(list(drafts.folder.iterdir())) == 3  # not taken
    finally:
        drafts.close()
    assert list(drafts.folder.iterdir()) == []
    finalize_dataset(store, tmp_path / "written", DatasetConfig(fps=FPS))
    assert file_digests(tmp_path / "drafted") == file_digests(tmp_path / "written")


def test_file_size_limits_start_new_drafts_as_finalize_starts_new_files(
    store: OutputStore, tmp_path: Path
) -> None:
    """Finalize's files of at most ``video_files_size_in_mb`` and ``data_files_size_in_mb``: the
    drafts close theirs at the same episode, and the dataset is the same with them."""
    video_limit = sum(_sizes(store, "observation.images.rgb.mp4")[:2])  # about two episodes a file
    data_limit = sum(_sizes(store, "frames.parquet")[:3])
    drafts = _drafts(store, store.committed(), video_limit, data_limit)
    config = DatasetConfig(
        fps=FPS, video_files_size_in_mb=video_limit / (1 << 20), data_files_size_in_mb=data_limit / (1 << 20)
    )
    try:
        finalize_dataset(store, tmp_path / "drafted", config, drafts)
        assert list(drafts.folder.iterdir()) == []  # each whole draft, and the open ones, taken
    finally:
        drafts.close()
    finalize_dataset(store, tmp_path / "written", config)
    assert file_digests(tmp_path / "drafted") == file_digests(tmp_path / "written")
    assert len(list((tmp_path / "written" / "videos" / "observation.images.rgb").rglob("*.mp4"))) > 1
    assert len(list((tmp_path / "written" / "data").rglob("*.parquet"))) > 1


def test_the_drafts_of_a_process_gone_are_deleted_and_a_live_ones_kept(tmp_path: Path) -> None:
    gone = tmp_path / "999999999-observation.images.rgb-0.mp4"  # past any pid_max
    live = tmp_path / f"{os.getppid()}-data-0.parquet"
    gone.write_bytes(b"draft")
    live.write_bytes(b"draft")
    clear_stale(tmp_path)
    assert not gone.exists() and live.exists()


def test_each_committed_episode_json_is_read_as_it_commits_and_given_to_finalize_once(
    store: OutputStore,
) -> None:
    """The episodes held back from the drafts are read too: finalize parses none of them."""
    drafts = _drafts(store, store.committed())
    try:
        for task_id in store.committed():
            path = store.committed_path(task_id)
            assert drafts.take_meta(path) == json.loads((path / EPISODE_FILE).read_text(encoding="utf-8"))
            assert drafts.take_meta(path) is None
    finally:
        drafts.close()


def test_an_episode_json_that_is_not_json_is_left_to_finalize(store: OutputStore, tmp_path: Path) -> None:
    """Not kept, so finalize reads it itself and says which episode is damaged."""
    damaged = store.committed_path(store.committed()[-1])
    (damaged / EPISODE_FILE).write_text("{not json", encoding="utf-8")
    drafts = _drafts(store, store.committed())
    try:
        assert drafts.take_meta(damaged) is None
        with pytest.raises(InvalidData, match=f"committed episode {damaged.name!r} is damaged"):
            finalize_dataset(store, tmp_path / "dataset", DatasetConfig(fps=FPS), drafts)
    finally:
        drafts.close()
