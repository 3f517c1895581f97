"""LeRobotClips reads the clips the episodes hold (finalized dataset and a running store alike),
grows append-only, and ResumableSampler gives one global order: deterministic, sharded over
ranks, resumable on any number of ranks."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from support.clip_data import HEIGHT, WIDTH, episode, finalize, write_run
from troupe.actors.lerobot.episode import write_episode
from troupe.actors.lerobot.format import video_file
from troupe.actors.lerobot.video import decode_video
from troupe.actors.training.dataset import (
    DatasetDamaged,
    LeRobotClips,
    NotEnoughEpisodes,
    ResumableSampler,
    clip_batches,
    committed_episodes,
    store_dir,
)
from troupe.runtime.tasks.output_store import OutputStore

LENGTHS = {"ep-a": 20, "ep-b": 13, "ep-c": 5}  # ep-c is shorter than a clip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("clips")
    run = base / "run"
    episodes = write_run(run, LENGTHS)
    finalize(run, base / "dataset")
    return {"run": run, "dataset": base / "dataset", "episodes": episodes}


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key


def test_clip_shapes_and_dtypes(data: dict[str, Any]) -> None:
    ds = LeRobotClips(data["dataset"], clip_frames=4, action_steps=6)
    assert ds.mode == "finalized" and ds.episodes == 3 and ds.skipped == 1
    assert len(ds) == 4 + 2  # ep-a: starts 0, 4, 8, 12 (14 <= 20); ep-b: 0, 4 (4 + 6 <= 13)
    item = ds[5]
    assert item["video"].dtype == torch.uint8 and item["video"].shape == (3, 4, HEIGHT, WIDTH)
    assert item["actions"].dtype == torch.float32 and item["actions"].shape == (6, 59)
    assert item["action_valid"].dtype == torch.bool and item["action_valid"].shape == (6, 59)
    assert (item["episode_index"], item["frame_index"], item["index"]) == (1, 4, 5)
    resized = LeRobotClips(data["dataset"], clip_frames=4, size=(16, 24))[0]["video"]
    assert resized.shape == (3, 4, 16, 24) and resized.dtype == torch.uint8
    assert ds.params() == {"clip_frames": 4, "size": None, "stride": 4, "video_key": "observation.images.rgb"}


def test_frames_and_actions_are_the_episodes(data: dict[str, Any]) -> None:
    ds = LeRobotClips(data["dataset"], clip_frames=4, stride=3)
    store = OutputStore(store_dir(data["run"]))
    for i in range(len(ds)):
        item = ds[i]
        task_id = sorted(LENGTHS)[item["episode_index"]]
        ep = data["episodes"][task_id]
        f0 = item["frame_index"]
        # The finalized file holds the episode's own packets: its decode, frame for frame.
        own = decode_video(store.committed_path(task_id) / video_file("observation.images.rgb"))
        assert np.array_equal(item["video"].permute(1, 2, 3, 0).numpy(), own[f0 : f0 + 4])
        # ... and H.264 at crf 18 keeps the source within a few levels.
        diff = np.abs(item["video"].permute(1, 2, 3, 0).numpy().astype(int) - ep.rgb[f0 : f0 + 4])
        assert diff.mean() < 3
        actions, mask = ep.action_arrays()
        assert np.array_equal(item["actions"].numpy(), actions[f0 : f0 + 4])
        assert np.array_equal(item["action_valid"].numpy(), mask[f0 : f0 + 4])


def test_store_mode_agrees_with_finalized(data: dict[str, Any]) -> None:
    final = LeRobotClips(data["dataset"], clip_frames=4, stride=2)
    store = LeRobotClips(data["run"], clip_frames=4, stride=2)
    assert store.mode == "store" and len(store) == len(final) and store.episodes == final.episodes
    for i in range(len(final)):
        _same(final[i], store[i])


def test_refresh_appends_new_episodes_and_keeps_indices(data: dict[str, Any], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(data["run"], run)
    ds = LeRobotClips(run, clip_frames=4)
    before = [ds[i] for i in range(len(ds))]
    assert ds.refresh() == len(before)
    # A new episode whose task id sorts first is still appended after the listed ones.
    write_episode(OutputStore(store_dir(run)), episode("ep-0", 9, seed=42))
    assert committed_episodes(run) == 4
    assert ds.refresh() == len(before) + 2
    for i, old in enumerate(before):
        _same(old, ds[i])
    assert ds[len(before)]["episode_index"] == 3


def test_workers_read_clips_listed_after_they_started(data: dict[str, Any], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(data["run"], run)
    ds = LeRobotClips(run, clip_frames=4)
    n = len(ds)
    sampler = ResumableSampler(ds, batch_size=n, seed=1)  # one step per epoch
    loader = clip_batches(ds, n, sampler, num_workers=1)
    it = iter(loader)
    try:
        first = next(it)  # the worker process exists now, with the dataset as it was
        write_episode(OutputStore(store_dir(run)), episode("ep-0", 8, seed=42))
        # The sampler refreshes at each epoch (a few are already read ahead): later epochs
        # permute the grown list, whose new clips the worker never listed.
        batches = [next(it) for _ in range(8)]
    finally:
        it._shutdown_workers()  # type: ignore[attr-defined]
    assert sorted(first["index"].tolist()) == list(range(n))
    seen = torch.cat([b["index"] for b in batches]).tolist()
    assert n + 1 in seen
    pos = next(b for b in batches if n + 1 in b["index"].tolist())
    k = pos["index"].tolist().index(n + 1)
    _same({key: v[k] for key, v in pos.items()}, {k2: torch.as_tensor(v) for k2, v in ds[n + 1].items()})


def test_bad_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nowhere"):
        LeRobotClips(tmp_path / "nowhere")
    (tmp_path / ".troupe" / "episodes").mkdir(parents=True)
    with pytest.raises(NotEnoughEpisodes, match="min_episodes=1"):
        LeRobotClips(tmp_path)
    with pytest.raises(ValueError, match="clip_frames=0"):
        LeRobotClips(tmp_path, clip_frames=0)


def test_too_short_episodes_are_final_only_in_a_finalized_dataset(data: dict[str, Any]) -> None:
    """A finalized dataset cannot grow: its shortage is final, and the trainer does not restart
    for it. A run's folder may still be growing: a later try may find enough."""
    longest = max(LENGTHS.values())
    with pytest.raises(NotEnoughEpisodes, match=f"0 episodes of at least {longest + 1} frames") as finalized:
        LeRobotClips(data["dataset"], clip_frames=longest + 1)
    assert finalized.value.final is True
    with pytest.raises(NotEnoughEpisodes) as growing:
        LeRobotClips(data["run"], clip_frames=longest + 1)
    assert growing.value.final is False


def _damage(file: Path, how: str) -> None:
    if how == "truncate":
        with file.open("r+b") as f:
            f.truncate(file.stat().st_size // 2)
    elif how == "garble":  # the same size, parquet's magic and footer length kept: thrift fails
        raw = file.read_bytes()
        file.write_bytes(raw[:4] + bytes(b ^ 0x5A for b in raw[4:-8]) + raw[-8:])
    else:
        file.write_text("{garbage")


@pytest.mark.parametrize(
    ("kind", "file", "how"),
    [
        ("dataset", "data/chunk-000/file-000.parquet", "truncate"),
        ("dataset", "data/chunk-000/file-000.parquet", "garble"),
        ("dataset", "meta/episodes/chunk-000/file-000.parquet", "truncate"),
        ("dataset", "meta/episodes/chunk-000/file-000.parquet", "garble"),
        ("dataset", "meta/info.json", "text"),
        ("run", ".troupe/episodes/committed/ep-a/frames.parquet", "truncate"),
        ("run", ".troupe/episodes/committed/ep-a/frames.parquet", "garble"),
        ("run", ".troupe/episodes/committed/ep-a/episode.json", "text"),
    ],
)
def test_a_dataset_file_that_does_not_read_is_damaged_named_on_one_line(
    data: dict[str, Any], tmp_path: Path, kind: str, file: str, how: str
) -> None:
    """pyarrow's and json's own errors (ArrowInvalid, a thrift error spanning lines, a
    JSONDecodeError naming no file) were restarted three times over, the same each time."""
    root = tmp_path / kind
    shutil.copytree(data[kind], root)
    assert (root / file).is_file()
    _damage(root / file, how)
    with pytest.raises(DatasetDamaged) as info:
        ds = LeRobotClips(root, clip_frames=4)
        for i in range(len(ds)):
            ds[i]
    message = str(info.value)
    assert "\n" not in message
    assert f"{root / file} cannot be read (" in message
    if kind == "dataset":
        assert "the same command run again on its --out writes it again" in message
    else:
        assert f"delete {(root / file).parent} and run the same command again" in message


def test_a_missing_episodes_file_is_named_missing(data: dict[str, Any], tmp_path: Path) -> None:
    """meta/episodes without its parquet: the run said "0 episodes of at least 8 frames" and to
    generate more data; meta/info.json (written last) says how many there are."""
    root = tmp_path / "dataset"
    shutil.copytree(data["dataset"], root)
    for f in (root / "meta" / "episodes").rglob("*.parquet"):
        f.unlink()
    with pytest.raises(DatasetDamaged) as info:
        LeRobotClips(root, clip_frames=4)
    message = str(info.value)
    assert message.startswith(f"{root / 'meta' / 'episodes'} holds no parquet file, but ")
    assert "says total_episodes = 3: an episodes file is missing; the dataset is damaged" in message
    assert "\n" not in message


@pytest.mark.parametrize("kind", ["dataset", "run"])
def test_a_missing_video_is_damage_named_on_one_line(data: dict[str, Any], tmp_path: Path, kind: str) -> None:
    """av's FileNotFoundError (an OSError) escaped: train-vae printed a traceback, and troupe
    run restarted the ranks three times on it, without the way out."""
    root = tmp_path / kind
    shutil.copytree(data[kind], root)
    videos = sorted(root.rglob("*images.rgb*.mp4")) or sorted(root.rglob("*images.rgb*/**/*.mp4"))
    assert videos  # the feature the clips read (the depth video is not)
    videos[0].unlink()
    with pytest.raises(DatasetDamaged) as info:
        ds = LeRobotClips(root, clip_frames=4)
        for i in range(len(ds)):
            ds[i]
    message = str(info.value)
    assert "\n" not in message
    assert f"{videos[0]} is missing; the dataset is damaged" in message
    if kind == "dataset":
        assert "the same command run again on its --out writes it again" in message
    else:
        assert f"delete {videos[0].parent} and run the same command again" in message


# -- the sampler, over a dataset of n clips that may grow --------------------------------------


class _Clips:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def refresh(self) -> int:
        return self.n


def _steps(sampler: ResumableSampler, steps: int) -> list[list[int]]:
    it = iter(sampler)
    return [[next(it) for _ in range(sampler.batch_size)] for _ in range(steps)]


def _global(n: int, b: int, world: int, steps: int, seed: int = 3, start: Any = 0) -> list[int]:
    """The positions every rank took, step by step, concatenated in rank order."""
    ranks = [_steps(ResumableSampler(_Clips(n), b, seed, rank=r, world_size=world, start=start), steps)
             for r in range(world)]  # fmt: skip
    return [i for step in zip(*ranks, strict=True) for batch in step for i in batch]


def test_sampler_is_deterministic_and_seeded() -> None:
    a = _steps(ResumableSampler(_Clips(10), 3, seed=1), 9)
    assert a == _steps(ResumableSampler(_Clips(10), 3, seed=1), 9)
    assert a != _steps(ResumableSampler(_Clips(10), 3, seed=2), 9)
    flat = [i for batch in a for i in batch]
    # 3 steps per epoch (the tail of 1 dropped); each epoch a fresh permutation.
    epochs = [flat[0:9], flat[9:18], flat[18:27]]
    assert all(len(set(e)) == 9 for e in epochs) and epochs[0] != epochs[1]
    assert _steps(ResumableSampler(_Clips(5), 2, shuffle=False), 4) == [[0, 1], [2, 3], [0, 1], [2, 3]]


def test_ranks_are_disjoint_and_cover_the_epoch_minus_the_tail() -> None:
    n, b, world = 23, 2, 3  # a step takes 6: 3 steps per epoch, a tail of 5 dropped
    ranks = [
        _steps(ResumableSampler(_Clips(n), b, seed=5, rank=r, world_size=world), 3) for r in range(world)
    ]
    taken = [i for r in ranks for batch in r for i in batch]
    assert len(taken) == len(set(taken)) == 18
    perm = _global(n, b, world, 3, seed=5)
    assert sorted(perm) == sorted(taken)
    one = _global(n, b * world, 1, 3, seed=5)  # one rank with the whole step sees the same order
    assert perm == one


def test_resume_continues_exactly_and_on_other_world_sizes() -> None:
    n, b = 17, 2
    sampler = ResumableSampler(_Clips(n), b, seed=9, world_size=2, rank=0)
    it = iter(sampler)
    for _ in range(b * 7):  # 7 steps read ahead of what was trained
        next(it)
    state = sampler.state_at(5)  # 5 steps trained: epoch 1 (4 steps of 4 per 17-clip epoch), 1 step in
    assert (state["epoch"], state["offset"], state["start"]) == (1, 4, 17 + 4)
    whole = _global(n, b, 2, 12, seed=9)
    assert _global(n, b, 2, 7, seed=9, start=state) == whole[5 * 4 :][: 7 * 4]
    assert _global(n, b, 2, 7, seed=9, start=state["start"]) == whole[5 * 4 :][: 7 * 4]
    # On 1 rank (a step of 2) and on 4 ranks (a step of 8): the same permutation goes on.
    one = _global(n, b, 1, 6, seed=9, start=state)
    assert one == whole[5 * 4 : 5 * 4 + 12]
    four = _global(n, b, 4, 1, seed=9, start=state)  # 4 + 8 <= 17: one step left in epoch 1
    assert four == whole[5 * 4 : 5 * 4 + 8]


def test_resume_in_a_grown_store_keeps_the_epoch() -> None:
    clips = _Clips(12)
    sampler = ResumableSampler(clips, 4, seed=0)
    it = iter(sampler)
    first = [next(it) for _ in range(4)]
    state = sampler.state_at(1)
    clips.n = 20  # grown since: the resumed epoch still permutes the 12 it started with
    resumed = _steps(ResumableSampler(clips, 4, seed=0, start=state), 3)
    again = _steps(ResumableSampler(_Clips(12), 4, seed=0), 3)
    assert first == again[0] and resumed[:2] == again[1:3]
    assert len(set(resumed[2])) == 4  # the next epoch is over the 20 clips
