from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.file_digests import file_digests
from troupe.actors.lerobot import writer as lerobot_writer
from troupe.actors.lerobot.episode import EpisodeConfig, EpisodeData, write_episode
from troupe.actors.lerobot.errors import InvalidData
from troupe.actors.lerobot.finalize import DatasetConfig, finalize_dataset
from troupe.actors.lerobot.format import DEPTH_KEY, RGB_KEY, gray_to_depth, video_file
from troupe.actors.lerobot.stats import stats_to_json, vector_stats
from troupe.actors.lerobot.video import (
    VideoConfig,
    best_codec,
    concat_videos,
    decode_video,
    encode_video,
)
from troupe.actors.lerobot.writer import AsyncWriter
from troupe.runtime.errors import ActorStopped, CommitError, MailboxFull
from troupe.runtime.tasks import output_store as commit_mod
from troupe.runtime.tasks.output_store import OutputStore

FPS = 10
H, W = 48, 64
LENGTHS = {"task-a": 10, "task-b": 12, "task-c": 15, "task-d": 11}
TASKS = {
    "task-a": "navigate to the goal",
    "task-b": "pick the cup",
    "task-c": "navigate to the goal",
    "task-d": "pick the cup",
}


def _rgb(length: int, seed: int, h: int = H, w: int = W) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    frames = np.empty((length, h, w, 3), dtype=np.uint8)
    for i in range(length):
        frames[i, ..., 0] = (x * 3 + i * 4) % 256
        frames[i, ..., 1] = y * 3 + seed * 20  # no wrap: a hard edge would blur
        frames[i, ..., 2] = 100 + seed * 10
    return frames


def _episode(task_id: str, length: int | None = None, seed: int = 0, **kw: object) -> EpisodeData:
    length = length or LENGTHS[task_id]
    rng = np.random.default_rng(seed)
    depth = np.broadcast_to(np.linspace(0.5, 8.0, W, dtype=np.float32), (length, H, W)).copy()
    return EpisodeData(
        task_id=task_id,
        task=TASKS.get(task_id, "navigate to the goal"),
        fps=FPS,
        rgb=_rgb(length, seed),
        depth=depth,
        ego=rng.normal(size=(length, 9)).astype(np.float32),
        extra={"seed": seed},
        **kw,  # type: ignore[arg-type]
    )


def _write_all(store: OutputStore) -> None:
    for seed, task_id in enumerate(LENGTHS):
        assert write_episode(store, _episode(task_id, seed=seed)) is True


@pytest.fixture
def store(tmp_path: Path) -> OutputStore:
    return OutputStore(tmp_path / "store", durable=False)


def test_write_episode_commits_once(store: OutputStore) -> None:
    """An episode commits its frames, two videos and metadata once; a rewrite is a no-op."""
    ep = _episode("task-a")
    assert write_episode(store, ep) is True
    assert write_episode(store, ep) is False
    out = store.committed_path("task-a")
    frames = pq.read_table(out / "frames.parquet")
    assert frames.num_rows == 10
    assert frames.schema.field("action").type == pa.list_(pa.float32(), 59)
    assert frames.schema.field("action_mask").type == pa.list_(pa.bool_(), 59)
    mask = np.array(frames.column("action_mask").to_pylist())
    assert mask[:, :9].all() and not mask[:, 9:].any()
    meta = json.loads((out / "episode.json").read_text())
    assert meta["length"] == 10 and meta["task"] == "navigate to the goal"
    assert np.shape(meta["stats"][RGB_KEY]["mean"]) == (3, 1, 1)
    assert len(decode_video(out / video_file(DEPTH_KEY))) == 10


def test_episode_data_rejects_bad_input() -> None:
    """Wrong shapes, dtypes, fps or non-finite poses raise InvalidData at construction."""
    good = _episode("task-a")
    bad = [
        {"rgb": good.rgb.astype(np.float32)},
        {"depth": good.depth[:, :10]},
        {"ego": np.full((10, 9), np.nan, np.float32)},
        {"fps": 0},
        {"task": ""},
        {"extra": {"x": object()}},
        {"actions": np.zeros((10, 59), np.float32)},
    ]
    for change in bad:
        fields = {**good.__dict__, **change}
        with pytest.raises(InvalidData):
            EpisodeData(**fields)


def test_disk_failure_hides_episode_and_retry_commits(
    store: OutputStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing disk write raises CommitError, leaves no episode, and a retry commits once."""

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)  # what write_episode imports as it writes
    with pytest.raises(CommitError, match="task-a"):
        write_episode(store, _episode("task-a"))
    assert store.committed() == [] and list(store.staging_dir.iterdir()) == []
    monkeypatch.undo()
    assert write_episode(store, _episode("task-a")) is True
    assert write_episode(store, _episode("task-a")) is False


def test_async_writer_writes_and_counts(store: OutputStore) -> None:
    """AsyncWriter commits every submitted episode off the caller's thread and counts bytes."""
    writer = AsyncWriter(store, max_pending=2, threads=2)
    futures = [writer.submit(_episode(t, seed=i), timeout=10) for i, t in enumerate(LENGTHS)]
    futures.append(writer.submit(_episode("task-a"), timeout=10))
    results = [f.result(timeout=20) for f in futures]
    assert sorted(results[:4]) == [True] * 4 and results[4] is False
    assert writer.close(timeout=10) is True
    stats = writer.statistics()
    assert (stats.pending, stats.written, stats.duplicates, stats.failed) == (0, 4, 1, 0)
    assert stats.bytes > 0
    assert store.committed() == sorted(LENGTHS)
    with pytest.raises(ActorStopped):
        writer.submit(_episode("task-a"))


class _Gate:
    """Stands in for write_episode: each call blocks until released (bounded)."""

    def __init__(self, fail: bool = False) -> None:
        self.release = threading.Event()
        self.fail = fail

    def __call__(self, store: OutputStore, episode: EpisodeData, config: object) -> bool:
        assert self.release.wait(timeout=10)
        if self.fail:
            raise CommitError(errno.ENOSPC, "disk full")
        return True


def test_submit_blocks_at_max_pending(store: OutputStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """With max_pending episodes held, submit waits for room and times out as MailboxFull."""
    gate = _Gate()
    monkeypatch.setattr(lerobot_writer, "write_episode", gate)
    writer = AsyncWriter(store, max_pending=1, threads=1)
    first = writer.submit(_episode("task-a"))
    assert writer.statistics().pending == 1
    with pytest.raises(MailboxFull):
        writer.submit(_episode("task-b"), timeout=0.01)
    gate.release.set()
    assert first.result(timeout=10) is True
    assert writer.submit(_episode("task-b"), timeout=10).result(timeout=10) is True
    assert writer.close(timeout=10)


async def test_submit_async_awaits_room(store: OutputStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """submit_async waits for room without blocking the loop, and reports write failures."""
    gate = _Gate(fail=True)
    monkeypatch.setattr(lerobot_writer, "write_episode", gate)
    writer = AsyncWriter(store, max_pending=1, threads=1)
    first = await writer.submit_async(_episode("task-a"))
    second = asyncio.ensure_future(writer.submit_async(_episode("task-b")))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(second), 0.01)
    gate.release.set()
    with pytest.raises(CommitError):
        await asyncio.wait_for(first, 10)
    with pytest.raises(CommitError):
        await asyncio.wait_for(await asyncio.wait_for(second, 10), 10)
    assert await asyncio.to_thread(writer.close, 10)
    assert writer.statistics().failed == 2


def test_finalize_reads_back(store: OutputStore, tmp_path: Path) -> None:
    """The finalized dataset has LeRobot v3.0's layout, dtypes, indices and decodable videos."""
    _write_all(store)
    root = tmp_path / "ds"
    summary = finalize_dataset(store, root, DatasetConfig(fps=FPS, robot_type="sim"))
    total = sum(LENGTHS.values())
    assert (summary.total_episodes, summary.total_frames, summary.total_tasks) == (4, total, 2)
    assert summary.task_ids == tuple(sorted(LENGTHS))

    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (4, total, 2)
    assert info["features"]["action"]["shape"] == [59] and info["features"]["timestamp"]["shape"] == [1]
    assert info["features"][DEPTH_KEY]["info"]["video.is_depth_map"] is True
    assert info["features"][DEPTH_KEY]["info"]["depth.max_m"] == 10.0

    data = pq.read_table(root / info["data_path"].format(chunk_index=0, file_index=0))
    assert data.num_rows == total
    assert data.schema.field("action").type == pa.list_(pa.float32(), 59)
    assert data.schema.field("observation.state").type == pa.list_(pa.float32(), 9)
    assert data.schema.field("timestamp").type == pa.float32()
    assert data.column("index").to_pylist() == list(range(total))
    assert np.array(data.column("action_mask").to_pylist()).shape == (total, 59)

    tasks = pd.read_parquet(root / "meta/tasks.parquet")
    assert list(tasks.index) == ["navigate to the goal", "pick the cup"]
    assert tasks.loc["pick the cup", "task_index"] == 1

    eps = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["length"] for e in eps] == list(LENGTHS.values())
    assert [e["tasks"] for e in eps] == [[TASKS[t]] for t in sorted(LENGTHS)]
    assert eps[1]["dataset_from_index"] == 10 and eps[1]["dataset_to_index"] == 22
    assert "stats/action/q99" in eps[0] and "stats/index/max" in eps[0]
    stats = json.loads((root / "meta/stats.json").read_text())
    assert np.shape(stats[RGB_KEY]["mean"]) == (3, 1, 1) and stats["index"]["max"] == [total - 1]

    for seed, (task_id, ep) in enumerate(zip(sorted(LENGTHS), eps, strict=True)):
        for key in (RGB_KEY, DEPTH_KEY):
            assert (ep[f"videos/{key}/chunk_index"], ep[f"videos/{key}/file_index"]) == (0, 0)
        path = root / info["video_path"].format(video_key=RGB_KEY, chunk_index=0, file_index=0)
        start, end = ep[f"videos/{RGB_KEY}/from_timestamp"], ep[f"videos/{RGB_KEY}/to_timestamp"]
        frames = decode_video(path, start, end, fps=FPS)
        assert len(frames) == LENGTHS[task_id]
        error = np.abs(frames[0].astype(int) - _rgb(1, seed)[0].astype(int)).mean()
        assert error < 3.0


def test_the_index_columns_stats_are_those_of_the_episodes_rows(store: OutputStore, tmp_path: Path) -> None:
    """What meta/episodes says of the columns finalize adds (episode, frame and task indices)
    is what their rows hold: every statistic, exactly, as lerobot would compute it from them."""
    _write_all(store)
    root = tmp_path / "ds"
    finalize_dataset(store, root, DatasetConfig(fps=FPS))
    data = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pandas()
    eps = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert len({e["task_index"] for e in data.to_dict("records")}) == 2  # both kinds of rows seen
    for ep in eps:
        rows = data[data["episode_index"] == ep["episode_index"]]
        for column in ("episode_index", "index", "task_index"):
            expected = stats_to_json({column: vector_stats(rows[column].to_numpy())})[column]
            for name, value in expected.items():
                assert ep[f"stats/{column}/{name}"] == value, (ep["episode_index"], column, name)


def test_a_damaged_episode_json_is_named_with_the_way_out(store: OutputStore, tmp_path: Path) -> None:
    _write_all(store)
    damaged = store.committed_path("task-b") / "episode.json"
    damaged.write_text(damaged.read_text()[:100])
    way_out = f"delete {store.committed_path('task-b')} and run the same command again"
    with pytest.raises(InvalidData, match=r"committed episode 'task-b' is damaged: .*episode\.json ") as info:
        finalize_dataset(store, tmp_path / "ds", DatasetConfig(fps=FPS))
    assert way_out in str(info.value)


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda stats: stats.pop("action"), "differ from those of 'task-a' in features or shapes"),
        (lambda stats: stats["action"]["min"].pop(), "differ from those of 'task-a' in features or shapes"),
        (lambda stats: stats["action"].update(min="none"), "are not numbers of one shape each"),
    ],
    ids=["feature gone", "shape", "not numbers"],
)
def test_an_episode_json_with_damaged_statistics_is_named_with_the_way_out(
    store: OutputStore, tmp_path: Path, damage: Callable[[dict], object], said: str
) -> None:
    _write_all(store)
    path = store.committed_path("task-b") / "episode.json"
    meta = json.loads(path.read_text())
    damage(meta["stats"])
    path.write_text(json.dumps(meta))
    damaged = f"committed episode 'task-b' is damaged: its statistics {said}"
    with pytest.raises(InvalidData, match=damaged) as info:
        finalize_dataset(store, tmp_path / "ds", DatasetConfig(fps=FPS))
    assert f"delete {store.committed_path('task-b')} and run the same command again" in str(info.value)


def test_a_frames_file_damaged_in_place_is_named_with_the_way_out(store: OutputStore, tmp_path: Path) -> None:
    """Bytes changed, the size kept (the store's check of sizes cannot see it): one error naming
    the episode and what to delete, not pyarrow's own message with no path."""
    _write_all(store)
    frames = store.committed_path("task-b") / "frames.parquet"
    data = bytearray(frames.read_bytes())
    data[-8:] = b"\0" * 8  # the footer's length and magic
    frames.write_bytes(bytes(data))
    assert store.damage("task-b") is None
    with pytest.raises(
        InvalidData, match=r"committed episode 'task-b' is damaged: .*frames\.parquet cannot be read"
    ) as info:
        finalize_dataset(store, tmp_path / "ds", DatasetConfig(fps=FPS))
    assert f"delete {store.committed_path('task-b')} and run the same command again" in str(info.value)


def test_the_writer_stage_sets_aside_an_episode_cut_short_and_lists_the_rest(
    store: OutputStore, tmp_path: Path
) -> None:
    """As a run starts, the stage names what is committed; an episode with a file cut short or
    deleted since is set aside and not named, so the run makes it again (every finalize
    failed on it, and a rerun could not get past it)."""
    from troupe.actors.datagen.lifecycle import LeRobotWriter
    from troupe.runtime.pipeline.stage import StageRun

    _write_all(store)
    with (store.committed_path("task-b") / "frames.parquet").open("r+b") as f:
        f.truncate(100)
    (store.committed_path("task-a") / video_file(RGB_KEY)).unlink()
    stage = LeRobotWriter(store=str(store.root))
    try:
        listed = stage.start(StageRun("p", "store", len(LENGTHS), 0, out=str(tmp_path)))
    finally:
        stage.writer.close(timeout=10)
    assert listed == sorted(set(LENGTHS) - {"task-a", "task-b"})
    assert store.committed() == listed
    assert sorted(p.name for p in (store.root / commit_mod.DAMAGED_DIR).iterdir()) == ["task-a", "task-b"]


def test_the_writer_stage_names_the_whole_committed_episodes_among_the_ids_asked(store: OutputStore) -> None:
    """jx 4: the engine asks the store stage, before it dead-letters or retries an item whose
    store call failed, whether its episode was committed (the replica died after the commit);
    one damaged since is not counted committed."""
    from troupe.actors.datagen.lifecycle import LeRobotWriter

    _write_all(store)
    (store.committed_path("task-a") / video_file(RGB_KEY)).unlink()
    stage = LeRobotWriter(store=str(store.root))
    try:
        named = stage.committed_among(["task-a", "task-b", "never-made"])
    finally:
        stage.writer.close(timeout=10)
    assert named == ["task-b"]


def test_finalize_is_idempotent_and_drops_stale_files(store: OutputStore, tmp_path: Path) -> None:
    """Re-running finalize writes identical bytes; a run with fewer files removes the extra ones."""
    _write_all(store)
    root = tmp_path / "ds"
    small = DatasetConfig(fps=FPS, chunks_size=2, data_files_size_in_mb=1e-6, video_files_size_in_mb=1e-6)
    summary = finalize_dataset(store, root, small)
    assert (summary.data_files, summary.video_files) == (4, 8)
    assert (root / "data/chunk-001/file-001.parquet").is_file()
    eps = pd.read_parquet(root / "meta/episodes/chunk-000/file-000.parquet")
    assert list(eps["data/chunk_index"]) == [0, 0, 1, 1]
    assert list(eps[f"videos/{RGB_KEY}/from_timestamp"]) == [0.0] * 4

    first = finalize_dataset(store, root, DatasetConfig(fps=FPS))
    before = file_digests(root)
    assert finalize_dataset(store, root, DatasetConfig(fps=FPS)) == first
    assert file_digests(root) == before
    assert not (root / "data/chunk-001").exists()
    assert sorted(p.name for p in (root / "videos" / RGB_KEY / "chunk-000").iterdir()) == ["file-000.mp4"]


def test_finalize_without_remux_gives_one_video_per_episode(store: OutputStore, tmp_path: Path) -> None:
    """remux_videos=False writes one mp4 per episode, each from timestamp 0."""
    _write_all(store)
    summary = finalize_dataset(store, tmp_path / "ds", DatasetConfig(fps=FPS, remux_videos=False))
    assert summary.video_files == 8
    eps = pd.read_parquet(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet")
    assert list(eps[f"videos/{DEPTH_KEY}/file_index"]) == [0, 1, 2, 3]
    assert list(eps[f"videos/{DEPTH_KEY}/to_timestamp"]) == [n / FPS for n in LENGTHS.values()]


def test_finalize_crash_leaves_whole_files_and_rerun_heals(
    store: OutputStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk error mid-finalize raises CommitError, leaves no partial file, and a rerun heals."""
    _write_all(store)
    root = tmp_path / "ds"
    real_replace = commit_mod.os.replace
    calls = []

    def flaky(src: object, dst: object) -> None:
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(commit_mod.os, "replace", flaky)
    with pytest.raises(CommitError, match="run the same troupe run again, or finalize_dataset"):
        finalize_dataset(store, root, DatasetConfig(fps=FPS))
    assert not list(root.rglob("*.tmp")) and not (root / "meta/info.json").exists()
    monkeypatch.undo()
    finalize_dataset(store, root, DatasetConfig(fps=FPS))
    clean = tmp_path / "clean"
    finalize_dataset(store, clean, DatasetConfig(fps=FPS))
    assert file_digests(root) == file_digests(clean)


def test_finalize_writes_the_tasks_and_statistics_beside_the_episodes_meta_and_info_json_last(
    store: OutputStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file fsynced before and after its replace: tasks.parquet and stats.json on the data
    files' thread, their fsyncs beside those of meta/episodes rather than after them; info.json,
    which says the dataset is whole, still the last."""
    _write_all(store)
    real_replace = commit_mod.os.replace
    replaced: list[tuple[str, str]] = []

    def noting(src: object, dst: object) -> None:
        real_replace(src, dst)  # type: ignore[arg-type]
        replaced.append((Path(str(dst)).name, threading.current_thread().name))

    monkeypatch.setattr(commit_mod.os, "replace", noting)
    finalize_dataset(store, tmp_path / "ds", DatasetConfig(fps=FPS))
    threads = dict(replaced)
    assert (
        threads["tasks.parquet"]
        == threads["stats.json"]
        != threads["info.json"]
        == threading.current_thread().name
    )
    assert replaced[-1][0] == "info.json"


class _Killed(BaseException):
    """A kill at a replacement: no ``except`` of finalize's handles it, as none sees a SIGKILL."""


def test_a_refinalisation_killed_halfway_leaves_no_info_json_and_a_rerun_makes_it_whole(
    store: OutputStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset finalized again over more episodes (--retry-dead) is replaced file by file:
    killed between two replacements, it mixed two datasets that LeRobot read without error.
    info.json, which LeRobot needs to open a folder, is gone before the first replacement and
    back only after the last, and a rerun makes the dataset whole."""
    for seed, task_id in enumerate(list(LENGTHS)[1:], start=1):
        assert write_episode(store, _episode(task_id, seed=seed)) is True
    root = tmp_path / "ds"
    info = root / "meta" / "info.json"
    real_replace = os.replace
    seen: list[tuple[str, bool]] = []  # (what was replaced, whether info.json was there)
    kill = {"at": 0}  # the replacement to kill at; 0: none

    def watched(src: object, dst: object) -> None:
        if Path(str(dst)).is_relative_to(root):
            seen.append((Path(str(dst)).name, info.exists()))
            if len(seen) == kill["at"]:
                raise _Killed
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(commit_mod.os, "replace", watched)
    finalize_dataset(store, root, DatasetConfig(fps=FPS))  # the dataset published first
    published = tmp_path / "published"
    shutil.copytree(root, published)
    assert write_episode(store, _episode("task-a", seed=0)) is True  # an item retried: episode 0
    clean = tmp_path / "clean"
    finalize_dataset(store, clean, DatasetConfig(fps=FPS))
    whole = file_digests(clean)
    seen.clear()
    finalize_dataset(store, root, DatasetConfig(fps=FPS))
    assert file_digests(root) == whole
    assert seen[-1][0] == "info.json" and not any(there for _, there in seen), seen
    for at in range(1, len(seen) + 1):
        shutil.rmtree(root)
        shutil.copytree(published, root)
        seen.clear()
        kill["at"] = at
        with pytest.raises(_Killed):
            finalize_dataset(store, root, DatasetConfig(fps=FPS))
        assert not info.exists(), f"killed at replacement {at} of {seen}"
        kill["at"] = 0
        finalize_dataset(store, root, DatasetConfig(fps=FPS))
        assert file_digests(root) == whole


def test_finalize_refuses_mixed_or_empty_input(store: OutputStore, tmp_path: Path) -> None:
    """No episodes or a wrong fps raise InvalidData; outputs that are not episodes are skipped."""
    with pytest.raises(InvalidData, match="no committed episodes"):
        finalize_dataset(store, tmp_path / "ds", DatasetConfig(fps=FPS))
    with store.stage("other-output") as staged:
        staged.commit()
    write_episode(store, _episode("task-a"))
    summary = finalize_dataset(store, tmp_path / "ds", DatasetConfig(fps=FPS))
    assert summary.skipped == ("other-output",) and summary.total_episodes == 1
    with pytest.raises(InvalidData, match="fps"):
        finalize_dataset(store, tmp_path / "ds", DatasetConfig(fps=FPS + 1))


def test_video_odd_size_mpeg4_and_depth_levels(tmp_path: Path) -> None:
    """Odd frames are padded to even, mpeg4 works, and depth survives within a few levels."""
    frames = _rgb(5, 1, h=31, w=45)
    info = encode_video(tmp_path / "odd.mp4", frames, FPS, VideoConfig(codec="mpeg4"))
    assert (info.codec, info.height, info.width) == ("mpeg4", 32, 46)
    assert (info.source_height, info.source_width) == (31, 45)
    decoded = decode_video(tmp_path / "odd.mp4")
    assert decoded.shape == (5, 32, 46, 3)
    assert np.abs(decoded[:, :31, :45].astype(int) - frames.astype(int)).mean() < 4.0

    store = OutputStore(tmp_path / "s", durable=False)
    ep = _episode("task-a")
    write_episode(store, ep, EpisodeConfig(depth_max_m=10.0))
    gray = decode_video(store.committed_path("task-a") / video_file(DEPTH_KEY))
    metres = gray_to_depth(gray[..., 0], 10.0)
    assert np.abs(metres - ep.depth).mean() < 2 * 10.0 / 255


def _x264_options(path: Path) -> list[str]:
    """The options libx264 wrote into the stream (its SEI user data), one ``key=value`` each."""
    data = path.read_bytes()
    start = data.index(b"options: ") + len(b"options: ")
    return data[start : data.index(b"\x00", start)].decode("ascii", "replace").split()


@pytest.mark.skipif(best_codec() != "libx264", reason="this PyAV's ffmpeg has no libx264")
def test_libx264_runs_without_mbtree_so_the_same_frames_give_the_same_bytes(tmp_path: Path) -> None:
    """libx264's macroblock tree (with its AVX-512 kernels) made the same frames encode into
    other bytes from one process to the next: the default turns it off, and it reaches x264."""
    frames = _rgb(6, 1)
    encode_video(tmp_path / "a.mp4", frames, FPS)
    assert "mbtree=0" in _x264_options(tmp_path / "a.mp4")
    encode_video(tmp_path / "b.mp4", frames, FPS)
    assert (tmp_path / "a.mp4").read_bytes() == (tmp_path / "b.mp4").read_bytes()
    encode_video(tmp_path / "on.mp4", frames, FPS, VideoConfig(mbtree=True))
    assert "mbtree=1" in _x264_options(tmp_path / "on.mp4")


@pytest.mark.skipif(best_codec() != "libx264", reason="this PyAV's ffmpeg has no libx264")
def test_info_names_the_codec_as_lerobot_does(store: OutputStore, tmp_path: Path) -> None:
    """info.json's ``video.codec`` is the stream's codec by its canonical name, as lerobot fills
    it from the file ("h264"): it said "libx264", an ffmpeg encoder (report ds 5). So for an
    episode committed before, whose episode.json names the encoder."""
    import av

    _write_all(store)
    meta_path = store.committed_path("task-a") / "episode.json"
    meta = json.loads(meta_path.read_text())
    for info in meta["videos"].values():
        info["codec"] = "libx264"  # as troupe wrote it before
    meta_path.write_text(json.dumps(meta))
    root = tmp_path / "ds"
    finalize_dataset(store, root, DatasetConfig(fps=FPS))
    info = json.loads((root / "meta/info.json").read_text())
    for key in (RGB_KEY, DEPTH_KEY):
        assert info["features"][key]["info"]["video.codec"] == "h264"
        path = root / info["video_path"].format(video_key=key, chunk_index=0, file_index=0)
        with av.open(str(path)) as container:
            assert container.streams.video[0].codec.canonical_name == "h264"
    assert encode_video(tmp_path / "one.mp4", _rgb(2, 0), FPS).codec == "h264"


def test_concat_videos_spans(tmp_path: Path) -> None:
    """Remuxed videos keep every frame, each source inside its returned span."""
    paths = []
    for i, n in enumerate((3, 5)):
        paths.append(tmp_path / f"{i}.mp4")
        encode_video(paths[-1], _rgb(n, i), FPS)
    spans = concat_videos(paths, tmp_path / "all.mp4", FPS)
    assert spans == [(0.0, 0.3), (0.3, 0.8)]
    assert len(decode_video(tmp_path / "all.mp4", *spans[1], fps=FPS)) == 5
    assert len(decode_video(tmp_path / "all.mp4")) == 8


def test_concat_videos_refuses_mismatched_sources_and_leaves_no_file(tmp_path: Path) -> None:
    small = tmp_path / "small.mp4"
    large = tmp_path / "large.mp4"
    rng = np.random.default_rng(0)
    encode_video(small, rng.integers(0, 255, (4, 16, 16, 3), dtype=np.uint8), FPS)
    encode_video(large, rng.integers(0, 255, (4, 32, 32, 3), dtype=np.uint8), FPS)
    dest = tmp_path / "all.mp4"
    with pytest.raises(InvalidData, match="differs from"):
        concat_videos([small, large], dest, FPS)
    assert not dest.exists()


def test_finalize_splits_videos_an_episode_json_misdeclares(store: OutputStore, tmp_path: Path) -> None:
    """Videos are grouped by what episode.json declares, but the remux checks the files: an
    episode whose codec differs from what it declares still gets a file of its own."""
    write_episode(store, _episode("task-a"))
    write_episode(store, _episode("task-b"), EpisodeConfig(video=VideoConfig(codec="mpeg4")))
    meta_path = store.committed_path("task-b") / "episode.json"
    meta = json.loads(meta_path.read_text())
    for info in meta["videos"].values():
        info["codec"] = "h264"  # declares what task-a has: grouping alone would mix them
    meta_path.write_text(json.dumps(meta))
    root = tmp_path / "ds"
    summary = finalize_dataset(store, root, DatasetConfig(fps=FPS))
    assert summary.total_episodes == 2
    assert summary.video_files == 4  # two keys, a file per codec each
    episodes = pd.read_parquet(root / "meta" / "episodes")
    assert sorted(episodes[f"videos/{RGB_KEY}/file_index"]) == [0, 1]
    assert list(episodes[f"videos/{RGB_KEY}/from_timestamp"]) == [0.0, 0.0]


def test_a_finalize_blocked_by_a_folder_names_it_and_says_the_episodes_are_kept(
    store: OutputStore, tmp_path: Path
) -> None:
    """A folder where meta/info.json goes fails every finalize the same way: the error names
    it as what to move, and does not claim that nothing was committed (the data and video
    files are in place by then)."""
    _write_all(store)
    root = tmp_path / "ds"
    (root / "meta" / "info.json").mkdir(parents=True)
    with pytest.raises(CommitError) as failed:
        finalize_dataset(store, root, DatasetConfig(fps=FPS))
    said = str(failed.value)
    assert f"move or delete {root / 'meta' / 'info.json'}, which is in the way" in said
    assert "Nothing was committed" not in said and "The committed episodes are kept" in said


def test_the_writer_stage_finalises_the_runs_items_only(store: OutputStore, tmp_path: Path) -> None:
    """A committed episode that is no item of the run (another run's, copied into the store) is
    left out of the dataset and named: a run of 2 items wrote a dataset of 3 episodes, without
    a word, one of them made with a config the run's record does not name (report up 2)."""
    from troupe.actors.datagen.lifecycle import LeRobotWriter
    from troupe.runtime.pipeline.stage import StageRun

    for seed, task_id in enumerate(("p-000000", "p-000001", "p-000039")):
        assert write_episode(store, _episode(task_id, length=10 + seed, seed=seed)) is True
    stage = LeRobotWriter(store=str(store.root))
    try:
        final = stage.finalize(StageRun("p", "store", 2, 0, out=str(tmp_path / "ds")))
    finally:
        stage.writer.close(timeout=10)
    assert final["episodes"] == 2 and final["frames"] == 21 and final["left_out"] == ["p-000039"]
    assert "left out 1 committed episode(s)" in final["summary"] and "p-000039" in final["summary"]
    eps = pd.read_parquet(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet")
    assert len(eps) == 2
    assert store.committed() == ["p-000000", "p-000001", "p-000039"]  # said, not deleted


def test_the_writer_stage_says_when_a_dataset_grown_again_renumbers_its_episodes(
    store: OutputStore, tmp_path: Path
) -> None:
    """Episodes are numbered in task id order: one made after the dataset was published (an
    item --retry-dead made) takes its place among them, and the indices after it shift. The
    run said only `dataset: 3 episodes`, and a split by index named other episodes (dr 2);
    it says how many published episodes have new indices now, and nothing when none has."""
    from troupe.actors.datagen.lifecycle import LeRobotWriter
    from troupe.runtime.pipeline.stage import StageRun

    for seed, task_id in ((1, "p-000001"), (2, "p-000002")):
        assert write_episode(store, _episode(task_id, length=10 + seed, seed=seed)) is True
    stage = LeRobotWriter(store=str(store.root))
    run = StageRun("p", "store", 4, 0, out=str(tmp_path / "ds"))
    try:
        first = stage.finalize(run)
        assert "renumbered" not in first and "new indices" not in first["summary"]
        assert write_episode(store, _episode("p-000003", length=13, seed=3)) is True  # after them
        appended = stage.finalize(run)
        assert "renumbered" not in appended and "new indices" not in appended["summary"]
        assert write_episode(store, _episode("p-000000", length=10, seed=0)) is True  # before them
        grown = stage.finalize(run)
    finally:
        stage.writer.close(timeout=10)
    assert grown["episodes"] == 4 and grown["renumbered"] == 3
    assert "; 3 of the 3 episodes published there before have new indices" in grown["summary"]
    eps = pd.read_parquet(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet")
    assert list(eps["troupe/task_id"]) == ["p-000000", "p-000001", "p-000002", "p-000003"]
