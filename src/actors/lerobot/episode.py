"""One episode (one task's output) written into the OutputStore, exactly once.

A committed episode is a directory ``committed/<task_id>/`` holding::

    frames.parquet                       state, action, action_mask, timestamp, frame_index
    observation.images.rgb.mp4           frame i at i / fps seconds
    observation.images.depth.mp4         8-bit gray depth (lerobot_format's quantisation)
    episode.json                         length, task, fps, videos, per-feature stats, extra

Global indices (episode, frame, task) are not known per task; :mod:`lerobot_finalize` assigns
them when it consolidates every committed episode into the LeRobot v3.0 layout.

The action of step t is the ego pose of step t (an absolute pose target) in slots [0:9] of the
59-dim layout, masked valid, the rest masked invalid; a source with more fields passes full
``actions`` and ``action_mask`` instead. ``observation.state`` is the ego pose.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from troupe.actors.lerobot.errors import InvalidData
from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.output_store import OutputStore

from .action_layout import ACTION_DIM, empty_actions, set_ego
from .format import (
    ACTION_KEY,
    DEFAULT_DEPTH_MAX_M,
    DEPTH_KEY,
    EPISODE_FILE,
    EPISODE_FORMAT,
    FRAMES_FILE,
    MASK_KEY,
    RGB_KEY,
    STATE_DIM,
    STATE_KEY,
    depth_to_gray,
    frame_schema,
    video_file,
)
from .stats import image_stats, stats_to_json, vector_stats
from .video import VideoConfig, encode_video

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["EpisodeConfig", "EpisodeData", "write_episode"]

log = get_logger(__name__)


@dataclass(frozen=True)
class EpisodeConfig:
    """How episodes are encoded; every episode of one dataset must use the same values.

    Attributes:
        video: codec and quality of both videos.
        depth_max_m: depth quantisation range in metres (see lerobot_format).
    """

    video: VideoConfig = field(default_factory=VideoConfig)
    depth_max_m: float = DEFAULT_DEPTH_MAX_M


def _fail(task_id: str, what: str) -> InvalidData:
    return InvalidData(f"episode of task {task_id!r}: {what}")


@dataclass(frozen=True, eq=False)
class EpisodeData:
    """One task's episode, validated on construction (bad data fails here, not in a thread).

    Args:
        task_id: the task whose output this is; names the committed directory.
        task: the natural-language task, e.g. "navigate to the goal".
        fps: frames per second (int > 0).
        rgb: uint8 (T, H, W, 3), T >= 1.
        depth: float (T, H, W) metres; stored as float32.
        ego: float (T, 9) ego pose, position + 6D rotation, finite.
        extra: optional JSON-serialisable per-episode info, kept in episode.json and the
            dataset's episode metadata (column ``troupe/extra``).
        actions: optional full float32 (T, 59) actions; default: the ego pose in [0:9].
        action_mask: bool (T, 59) validity of ``actions``; required with ``actions``.

    Raises:
        InvalidData: any field has the wrong type, shape, dtype or non-finite values.
    """

    task_id: str
    task: str
    fps: int
    rgb: npt.NDArray[np.uint8]
    depth: npt.NDArray[np.float32]
    ego: npt.NDArray[np.float32]
    extra: Mapping[str, Any] | None = None
    actions: npt.NDArray[np.float32] | None = None
    action_mask: npt.NDArray[np.bool_] | None = None

    def __post_init__(self) -> None:
        tid = self.task_id
        if not isinstance(self.task, str) or not self.task.strip():
            raise _fail(tid, "task must be a non-empty string describing what the robot does")
        if isinstance(self.fps, bool) or not isinstance(self.fps, int) or self.fps <= 0:
            raise _fail(tid, f"fps {self.fps!r} must be a positive int")
        rgb = np.asarray(self.rgb)
        if rgb.dtype != np.uint8 or rgb.ndim != 4 or rgb.shape[-1] != 3 or len(rgb) == 0:
            raise _fail(tid, f"rgb is {rgb.dtype} {rgb.shape}; pass uint8 (T, H, W, 3), T >= 1")
        length, height, width = rgb.shape[:3]
        depth = np.asarray(self.depth)
        if depth.shape != (length, height, width) or not np.issubdtype(depth.dtype, np.floating):
            raise _fail(
                tid,
                f"depth is {depth.dtype} {depth.shape}; pass float metres, shape {(length, height, width)}",
            )
        ego = np.asarray(self.ego, dtype=np.float32)
        if ego.shape != (length, STATE_DIM) or not np.isfinite(ego).all():
            raise _fail(tid, f"ego is {ego.shape}; pass finite float32 ({length}, {STATE_DIM})")
        if (self.actions is None) != (self.action_mask is None):
            raise _fail(tid, "pass actions and action_mask together, or neither")
        if self.actions is not None:
            acts = np.asarray(self.actions, dtype=np.float32)
            mask = np.asarray(self.action_mask)
            if acts.shape != (length, ACTION_DIM) or mask.shape != acts.shape:
                raise _fail(tid, f"actions {acts.shape} / mask {mask.shape} must be ({length}, 59)")
            if mask.dtype != np.bool_ or not np.isfinite(acts[mask]).all():
                raise _fail(tid, "action_mask must be bool and valid actions finite")
            object.__setattr__(self, "actions", acts)
        try:
            json.dumps(dict(self.extra or {}), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise _fail(tid, f"extra is not JSON-serialisable ({exc}); keep it to plain types") from exc
        object.__setattr__(self, "rgb", rgb)
        object.__setattr__(self, "depth", depth.astype(np.float32, copy=False))
        object.__setattr__(self, "ego", ego)

    @property
    def length(self) -> int:
        """Number of frames T."""
        return len(self.rgb)

    def action_arrays(self) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """Return the (T, 59) actions and validity mask that will be stored."""
        if self.actions is not None and self.action_mask is not None:
            return self.actions, self.action_mask
        actions, mask = empty_actions(self.length)
        set_ego(actions, mask, self.ego)
        return actions, mask


def _fixed_list(values: npt.NDArray[Any], width: int, kind: pa.DataType) -> pa.Array:
    import pyarrow as pa

    flat = pa.array(np.ascontiguousarray(values).reshape(-1), type=kind)
    return pa.FixedSizeListArray.from_arrays(flat, width)


def _frames_table(ep: EpisodeData) -> pa.Table:
    import pyarrow as pa  # here, not as the module loads: see troupe.actors.lerobot's docstring

    actions, mask = ep.action_arrays()
    frame_index = np.arange(ep.length, dtype=np.int64)
    columns = [
        _fixed_list(ep.ego, STATE_DIM, pa.float32()),
        _fixed_list(actions, ACTION_DIM, pa.float32()),
        _fixed_list(mask, ACTION_DIM, pa.bool_()),
        pa.array((frame_index / ep.fps).astype(np.float32), type=pa.float32()),
        pa.array(frame_index, type=pa.int64()),
    ]
    return pa.Table.from_arrays(columns, schema=frame_schema())


def _stats(ep: EpisodeData, gray: npt.NDArray[np.uint8]) -> dict[str, Any]:
    actions, mask = ep.action_arrays()
    frame_index = np.arange(ep.length)
    return stats_to_json(
        {
            RGB_KEY: image_stats(ep.rgb),
            DEPTH_KEY: image_stats(gray),
            STATE_KEY: vector_stats(ep.ego),
            ACTION_KEY: vector_stats(actions),
            MASK_KEY: vector_stats(mask),
            "timestamp": vector_stats((frame_index / ep.fps).astype(np.float32)),
            "frame_index": vector_stats(frame_index),
        }
    )


def write_episode(store: OutputStore, episode: EpisodeData, config: EpisodeConfig = EpisodeConfig()) -> bool:
    """Write one episode aside and commit it under its task id, exactly once.

    A task that is already committed is skipped before any encoding.

    Args:
        store: the OutputStore of the dataset being produced.
        episode: the episode; its ``task_id`` keys the commit.
        config: video and depth encoding; the same for every episode of a dataset.

    Returns:
        True if this call committed the episode, False if the task was already committed.

    Raises:
        CommitError: a disk write failed (disk full, permissions); nothing is visible and the
            task can be retried.
        InvalidData: ffmpeg rejected the frames.
    """
    if store.is_committed(episode.task_id):
        log.info("episode_already_committed", task_id=episode.task_id)
        return False
    import pyarrow.parquet as pq

    with store.stage(episode.task_id) as staged:
        encoded = {}
        encoded[RGB_KEY] = encode_video(
            staged.path / video_file(RGB_KEY), episode.rgb, episode.fps, config.video
        )
        gray = depth_to_gray(episode.depth, config.depth_max_m)
        gray3 = np.repeat(gray[..., None], 3, axis=-1)
        encoded[DEPTH_KEY] = encode_video(
            staged.path / video_file(DEPTH_KEY), gray3, episode.fps, config.video
        )
        pq.write_table(_frames_table(episode), staged.path / FRAMES_FILE)
        meta = {
            "format": EPISODE_FORMAT,
            "task_id": episode.task_id,
            "task": episode.task,
            "length": episode.length,
            "fps": episode.fps,
            "depth_max_m": config.depth_max_m,
            "videos": {key: asdict(info) for key, info in encoded.items()},
            "stats": _stats(episode, gray3),
            "extra": dict(episode.extra or {}),
        }
        (staged.path / EPISODE_FILE).write_text(json.dumps(meta, sort_keys=True), encoding="utf-8")
        committed = staged.commit()
    log.info("episode_written", task_id=episode.task_id, frames=episode.length, committed=committed)
    return committed
