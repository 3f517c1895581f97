"""Training clips from a LeRobot dataset, and a sampler that resumes exactly on any rank count.

:class:`LeRobotClips` reads either a finalized LeRobot v3.0 dataset (``meta/info.json``) or a
``troupe run`` output folder while the run is still going: its committed episodes in
``<root>/.troupe/episodes`` (the store the LeRobotWriter commits each episode to), re-scanned by
:meth:`LeRobotClips.refresh`. A clip is ``clip_frames`` consecutive frames of one episode with
the actions (and their 59-dim validity mask) of the same span. Frames are decoded per clip with
PyAV, seeking to the span (in a finalized dataset, inside the shared mp4 from the episode's
``from_timestamp``); only a few episodes' action rows are cached (LRU), never frames.

In store mode episodes are listed in the order they are first seen (sorted by task id within one
scan), so the episodes of a finished run, all seen in the first scan, get the same indices as in
the dataset finalize writes; a later scan only appends, so a clip's index never changes.

:class:`ResumableSampler` (from :mod:`.sampler`, named here too) draws an infinite stream of
seeded epochs and shards each step's ``world_size * batch_size`` positions across ranks; its state
(:meth:`ResumableSampler.state_at`) is global, so a run saved by W ranks resumes on any other
number. :func:`clip_batches` builds the DataLoader; it hands workers the clip's location with its
index, so DataLoader worker processes (forked before the dataset grew) read the same clip the main
process listed.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from troupe.actors.lerobot.errors import InvalidData
from troupe.actors.lerobot.format import (
    ACTION_KEY,
    EPISODE_FILE,
    FRAMES_FILE,
    MASK_KEY,
    RGB_KEY,
    VIDEO_PATH,
    video_file,
)
from troupe.actors.lerobot.video import decode_video
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.pipeline.run_dir_lock import held_by_another
from troupe.runtime.tasks.output_store import COMMIT_MARKER

from .sampler import ResumableSampler

__all__ = [
    "ClipSource",
    "DatasetDamaged",
    "DatasetNotFound",
    "LeRobotClips",
    "NotEnoughEpisodes",
    "ResumableSampler",
    "being_written",
    "clip_batches",
    "committed_episodes",
    "store_dir",
]

ACTION_CACHE_EPISODES = 32
"""Episodes whose action rows a process keeps (LRU): bounded, whatever the dataset's size."""


class DatasetDamaged(ValueError):
    """A file of the dataset does not read as it must (a video cut short, rows missing): every
    restart would read it the same way, so the run ends rather than restarting on it."""


class DatasetNotFound(ValueError):
    """The dataset root holds neither a LeRobot dataset nor a ``troupe run`` folder. In a trainer
    rank, where the run's own check found one on its host, the rank's host does not have it at
    that path: every restart would look there again, so the run ends on it. ``root``: the path."""

    def __init__(self, message: str, root: Path) -> None:
        super().__init__(message)
        self.root = root


# A finalized dataset that ``troupe run`` made is written again by the same command: the files
# its finalize reported, changed since, are found and the dataset finalised again.
_REMAKE = "; if troupe run made it, the same command run again on its --out writes it again"


# A committed episode of a run folder is made again by the run once it is gone.
_REMAKE_EPISODE = (
    "; delete {path} and run the same command again on its --out, which makes that episode again"
)

# What a file that does not read raises: pyarrow's errors (a truncated or garbled parquet is
# ArrowInvalid or OSError), json's (ValueError), a key or a type missing from what parsed.
_UNREADABLE = (pa.ArrowException, OSError, ValueError, KeyError, TypeError)


def _unreadable(path: str | os.PathLike[str], exc: BaseException, way_out: str) -> DatasetDamaged:
    """The file, what reading it raised (pyarrow's messages span lines: on one here) and the way out."""
    said = " ".join(str(exc).split())[:300].rstrip()
    why = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
    return DatasetDamaged(f"{path} cannot be read ({why}); the dataset is damaged{way_out}")


def _read_json(path: Path, way_out: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except _UNREADABLE as exc:
        raise _unreadable(path, exc, way_out) from None
    if not isinstance(data, dict):
        raise DatasetDamaged(f"{path} cannot be read (not a JSON object); the dataset is damaged{way_out}")
    return data


class NotEnoughEpisodes(ValueError):
    """The dataset has fewer usable episodes than ``min_episodes``.

    ``final``: the dataset is finalized, so it cannot grow and a retry would fail the same way;
    otherwise it is a run's folder that may still be growing: try later.
    """

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


def store_dir(root: str | os.PathLike[str]) -> Path:
    """Where a ``troupe run`` output folder keeps its committed episodes."""
    return Path(root) / ".troupe" / "episodes"


def _committed(store: Path) -> list[Path]:
    committed = store / "committed"
    if not committed.is_dir():
        return []
    return sorted(
        p
        for p in committed.iterdir()
        if p.is_dir() and (p / COMMIT_MARKER).exists() and (p / EPISODE_FILE).is_file()
    )


def committed_episodes(root: str | os.PathLike[str]) -> int:
    """How many episodes a run folder (or a finalized dataset) holds now: cheap, for polling."""
    info = Path(root) / "meta" / "info.json"
    if info.is_file():
        data = _read_json(info, _REMAKE)
        try:
            return int(data["total_episodes"])
        except _UNREADABLE as exc:
            raise _unreadable(info, exc, _REMAKE) from None
    return len(_committed(store_dir(root)))


@dataclass(frozen=True)
class ClipSource:
    """Where one episode's frames and actions are: everything a worker needs to read a clip.

    Attributes:
        episode_index: the episode's index in the dataset.
        length: frames in the episode.
        fps: frame rate.
        video: the mp4 holding the episode's frames.
        video_from_s: the episode's first frame's timestamp in ``video``.
        frames: the parquet holding its rows (``frames.parquet`` of a committed episode, or a
            finalized dataset's data file with many episodes).
        shared: ``frames`` holds other episodes too (rows filtered by ``episode_index``).
    """

    episode_index: int
    length: int
    fps: int
    video: str
    video_from_s: float
    frames: str
    shared: bool


@lru_cache(maxsize=ACTION_CACHE_EPISODES)
def _actions(frames: str, episode_index: int, shared: bool) -> tuple[np.ndarray, np.ndarray]:
    """The (T, 59) actions and validity mask of one episode, in frame order."""
    columns = [ACTION_KEY, MASK_KEY, "frame_index"]
    way_out = _REMAKE if shared else _REMAKE_EPISODE.format(path=Path(frames).parent)
    try:
        if shared:
            table = pq.read_table(frames, columns=columns, filters=[("episode_index", "=", episode_index)])
        else:
            table = pq.read_table(frames, columns=columns)
    except _UNREADABLE as exc:
        raise _unreadable(frames, exc, way_out) from None
    table = table.take(pc.sort_indices(table, [("frame_index", "ascending")]))
    n = table.num_rows
    actions = table.column(ACTION_KEY).combine_chunks().flatten().to_numpy(zero_copy_only=False)
    mask = table.column(MASK_KEY).combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return (
        np.asarray(actions, dtype=np.float32).reshape(n, -1),
        np.asarray(mask, dtype=np.bool_).reshape(n, -1),
    )


def _finalized_sources(root: Path, video_key: str) -> list[ClipSource]:
    info_path = root / "meta" / "info.json"
    info = _read_json(info_path, _REMAKE)
    try:
        features = dict(info.get("features", {}))
        fps = int(info["fps"])
        video_template = str(info.get("video_path") or VIDEO_PATH)
        data_template = str(info["data_path"])
    except _UNREADABLE as exc:
        raise _unreadable(info_path, exc, _REMAKE) from None
    if video_key not in features:
        raise ValueError(f"dataset {root}: no video feature {video_key!r} (has {sorted(features)})")
    files = sorted((root / "meta" / "episodes").rglob("*.parquet"))
    rows: list[tuple[Path, dict[str, Any]]] = []
    for f in files:
        try:
            rows += [(f, row) for row in pq.read_table(f).to_pylist()]
        except _UNREADABLE as exc:
            raise _unreadable(f, exc, _REMAKE) from None
    _all_listed(root, info, files, {int(r.get("episode_index", -1)) for _, r in rows})
    sources = []
    for f, r in rows:
        try:
            video = video_template.format(
                video_key=video_key,
                chunk_index=r[f"videos/{video_key}/chunk_index"],
                file_index=r[f"videos/{video_key}/file_index"],
            )
            data = data_template.format(chunk_index=r["data/chunk_index"], file_index=r["data/file_index"])
            source = ClipSource(
                episode_index=int(r["episode_index"]),
                length=int(r["length"]),
                fps=fps,
                video=str(root / video),
                video_from_s=float(r[f"videos/{video_key}/from_timestamp"]),
                frames=str(root / data),
                shared=True,
            )
        except _UNREADABLE as exc:  # a row missing a field, or holding nulls
            raise _unreadable(f, exc, _REMAKE) from None
        sources.append(source)
    sources.sort(key=lambda s: s.episode_index)
    return sources


def _all_listed(root: Path, info: dict[str, Any], files: list[Path], listed: set[int]) -> None:
    """DatasetDamaged where ``meta/episodes`` lists fewer episodes than ``meta/info.json``'s
    ``total_episodes`` (written last, once every episode file is): a file of it is missing. The
    run said "0 episodes of at least 8 frames" and to generate more data."""
    total = info.get("total_episodes")
    if not isinstance(total, int) or isinstance(total, bool) or len(listed) >= total:
        return
    where = root / "meta" / "episodes"
    found = f"lists {len(listed)} episode(s) in {len(files)} file(s)" if files else "holds no parquet file"
    raise DatasetDamaged(
        f"{where} {found}, but {root / 'meta' / 'info.json'} says total_episodes = {total}: an "
        f"episodes file is missing; the dataset is damaged{_REMAKE}"
    )


def being_written(root: Path) -> bool:
    """Whether a ``troupe run`` holds the run folder ``root`` now (its journal's lock is taken):
    its dataset may still grow. A lock probed free is taken and let go at once."""
    journal = RunDir(root).journal_path
    return held_by_another(journal, root, "troupe run") is not None


def _store_source(path: Path, episode_index: int, video_key: str) -> ClipSource:
    way_out = _REMAKE_EPISODE.format(path=path)
    meta = _read_json(path / EPISODE_FILE, way_out)
    try:
        length, fps = int(meta["length"]), int(meta["fps"])
    except _UNREADABLE as exc:
        raise _unreadable(path / EPISODE_FILE, exc, way_out) from None
    return ClipSource(
        episode_index=episode_index,
        length=length,
        fps=fps,
        video=str(path / video_file(video_key)),
        video_from_s=0.0,
        frames=str(path / FRAMES_FILE),
        shared=False,
    )


def _positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"LeRobotClips {name}={value!r}: expected a positive integer")


def load_clip(
    source: ClipSource,
    frame: int,
    clip_frames: int,
    action_steps: int,
    size: tuple[int, int] | None,
) -> dict[str, Any]:
    """Read one clip: uint8 video (3, T, H, W), actions and their mask (Ta, 59)."""
    t0 = source.video_from_s + frame / source.fps
    try:
        frames = decode_video(Path(source.video), t0, t0 + clip_frames / source.fps, fps=source.fps)
    except InvalidData as exc:
        raise DatasetDamaged(f"episode {source.episode_index}: {exc}{_REMAKE}") from None
    except FileNotFoundError:  # av's too: a video gone is as damaged as one cut short (final)
        way_out = _REMAKE if source.shared else _REMAKE_EPISODE.format(path=Path(source.video).parent)
        raise DatasetDamaged(
            f"episode {source.episode_index}: {source.video} is missing; the dataset is damaged{way_out}"
        ) from None
    if len(frames) != clip_frames:
        raise DatasetDamaged(
            f"episode {source.episode_index}: {source.video} gave {len(frames)} frames at "
            f"{frame}..{frame + clip_frames - 1}, expected {clip_frames}; the video is damaged{_REMAKE}"
        )
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)  # (T, 3, H, W)
    if size is not None and tuple(video.shape[-2:]) != tuple(size):
        # Fixed settings (antialiased bilinear, rounded): the same bytes on every run and host.
        resized = F.interpolate(
            video.float(), size=size, mode="bilinear", antialias=True, align_corners=False
        )
        video = resized.round().clamp(0, 255).to(torch.uint8)
    actions, mask = _actions(source.frames, source.episode_index, source.shared)
    if len(actions) != source.length:
        raise DatasetDamaged(
            f"episode {source.episode_index}: {source.frames} has {len(actions)} rows, "
            f"expected {source.length}; the dataset is damaged{_REMAKE}"
        )
    span = slice(frame, frame + action_steps)
    return {
        "video": video.permute(1, 0, 2, 3).contiguous(),
        "actions": torch.from_numpy(actions[span].copy()),
        "action_valid": torch.from_numpy(mask[span].copy()),
        "episode_index": source.episode_index,
        "frame_index": frame,
    }


class LeRobotClips(torch.utils.data.Dataset[dict[str, Any]]):
    """Fixed-length clips of a LeRobot dataset or of a running troupe run's committed episodes.

    Args:
        root: a finalized LeRobot v3.0 dataset (has ``meta/info.json``) or a ``troupe run``
            output folder (committed episodes under ``.troupe/episodes``); auto-detected.
        clip_frames: frames per clip.
        action_steps: action rows per clip, from the clip's first frame (default ``clip_frames``).
        size: ``(H, W)`` to resize frames to; None keeps the stored size.
        stride: frames between the starts of consecutive clips of an episode (default
            ``clip_frames``: clips do not overlap).
        video_key: the video feature to read.
        min_episodes: fewer usable episodes (long enough for one clip) raise
            :class:`NotEnoughEpisodes`.

    Raises:
        ValueError: ``root`` is neither kind of folder, or an argument is out of range.
        NotEnoughEpisodes: fewer than ``min_episodes`` usable episodes.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        clip_frames: int = 8,
        action_steps: int | None = None,
        size: tuple[int, int] | None = None,
        stride: int | None = None,
        video_key: str = RGB_KEY,
        min_episodes: int = 1,
    ) -> None:
        for name, value in (("clip_frames", clip_frames), ("action_steps", action_steps), ("stride", stride)):
            _positive(name, value)
        if size is not None:
            if len(size) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in size):
                raise ValueError(f"LeRobotClips size={size!r}: expected (height, width), positive integers")
            size = (int(size[0]), int(size[1]))
        self.root = Path(root)
        self.clip_frames = clip_frames
        self.action_steps = action_steps or clip_frames
        self.size = size
        self.stride = stride or clip_frames
        self.video_key = video_key
        self.skipped = 0
        self._sources: list[ClipSource] = []
        self._seen: set[str] = set()
        self._clip_starts: list[int] = []  # first clip index of each listed source with clips
        self._clip_sources: list[int] = []  # the source behind each entry of _clip_starts
        self._total = 0
        if (self.root / "meta" / "info.json").is_file():
            self.mode = "finalized"
            for source in _finalized_sources(self.root, video_key):
                self._add(source)
        elif store_dir(self.root).is_dir():
            self.mode = "store"
            self.refresh()
        else:
            raise DatasetNotFound(
                f"dataset root {str(self.root)!r}: neither a LeRobot dataset (no meta/info.json) "
                "nor a troupe run folder (no .troupe/episodes); pass the folder `troupe run --out` wrote",
                self.root,
            )
        usable = len(self._sources) - self.skipped
        if usable < min_episodes:
            raise NotEnoughEpisodes(
                f"dataset {str(self.root)!r} has {usable} episodes of at least "
                f"{self._span} frames, fewer than min_episodes={min_episodes}",
                final=self.mode == "finalized",
            )

    @property
    def _span(self) -> int:
        return max(self.clip_frames, self.action_steps)

    def _add(self, source: ClipSource) -> None:
        self._sources.append(source)
        count = (source.length - self._span) // self.stride + 1 if source.length >= self._span else 0
        if count == 0:
            self.skipped += 1
            return
        self._clip_starts.append(self._total)
        self._clip_sources.append(len(self._sources) - 1)
        self._total += count

    def refresh(self) -> int:
        """List episodes committed since the last scan (store mode); return ``len(self)`` now.

        Clips already listed keep their indices: new episodes are only appended.
        """
        if self.mode == "store":
            for path in _committed(store_dir(self.root)):
                if path.name not in self._seen:
                    self._seen.add(path.name)
                    self._add(_store_source(path, len(self._sources), self.video_key))
        return self._total

    def __len__(self) -> int:
        return self._total

    @property
    def episodes(self) -> int:
        """Episodes listed, including those too short for a clip (counted in ``skipped``)."""
        return len(self._sources)

    def params(self) -> dict[str, Any]:
        """The preprocessing, as JSON data: part of the latent cache's key."""
        return {
            "clip_frames": self.clip_frames,
            "size": list(self.size) if self.size else None,
            "stride": self.stride,
            "video_key": self.video_key,
        }

    def locate(self, i: int) -> tuple[ClipSource, int]:
        """The episode of clip ``i`` and the clip's first frame.

        Raises:
            IndexError: ``i`` is not a clip index.
        """
        if isinstance(i, bool) or not 0 <= int(i) < self._total:
            raise IndexError(f"clip index {i} out of range: the dataset has {self._total} clips")
        k = bisect.bisect_right(self._clip_starts, int(i)) - 1
        source = self._sources[self._clip_sources[k]]
        return source, (int(i) - self._clip_starts[k]) * self.stride

    def read(self, i: int, source: ClipSource, frame: int) -> dict[str, Any]:
        """Clip ``i`` from its location (what :meth:`locate` gave, maybe in another process)."""
        item = load_clip(source, frame, self.clip_frames, self.action_steps, self.size)
        item["index"] = int(i)
        return item

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.read(i, *self.locate(i))


class _Located(torch.utils.data.Dataset[dict[str, Any]]):
    """Reads clips by location, so a worker process never needs the (grown) clip list."""

    def __init__(self, dataset: LeRobotClips) -> None:
        self.dataset = dataset

    def __getitem__(self, ref: tuple[int, ClipSource, int]) -> dict[str, Any]:
        return self.dataset.read(*ref)


class _LocatingSampler(torch.utils.data.Sampler[tuple[int, ClipSource, int]]):
    def __init__(self, sampler: torch.utils.data.Sampler[int], dataset: LeRobotClips) -> None:
        self.sampler = sampler
        self.dataset = dataset

    def __iter__(self) -> Iterator[tuple[int, ClipSource, int]]:
        for i in self.sampler:
            yield (i, *self.dataset.locate(i))


def clip_batches(
    dataset: LeRobotClips,
    batch_size: int,
    sampler: torch.utils.data.Sampler[int],
    num_workers: int = 0,
) -> torch.utils.data.DataLoader[dict[str, Any]]:
    """A DataLoader of batches: ``video`` uint8 (B, 3, T, H, W), ``actions`` (B, Ta, 59),
    ``action_valid`` bool (B, Ta, 59), ``index`` and ``episode_index`` int64 (B,), ``frame_index``.

    The sampler's indices are resolved to clip locations in this process (where ``refresh``
    runs), so workers read exactly the clips listed here.
    """
    return torch.utils.data.DataLoader(
        _Located(dataset),
        batch_size=batch_size,
        sampler=_LocatingSampler(sampler, dataset),
        num_workers=num_workers,
        drop_last=False,
        persistent_workers=num_workers > 0,
    )
