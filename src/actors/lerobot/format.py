"""The LeRobot v3.0 dataset format as troupe writes it (see shared/LEROBOT_V3.md).

One place for the feature keys, their dtypes and shapes, the Arrow schema of frame rows, the
depth quantisation, and the layout templates, so the per-episode writer and the finalizer agree
byte for byte with what lerobot 0.4.4's ``LeRobotDataset(repo_id, root=path)`` reads.

Depth is stored as an 8-bit gray video (R = G = B), linear in metres over a fixed range:
``level = round(clip(depth, 0, depth_max_m) / depth_max_m * 255)``, so one level is
``depth_max_m / 255`` metres (3.9 cm at the default 10 m). NaN (no return) and negative depths
become 0, +inf and anything beyond the range become 255. :func:`gray_to_depth` inverts it; the
range is also written into the depth feature's ``info`` (``depth.max_m``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .action_layout import ACTION_DIM, ACTION_NAMES
from .video import codec_name

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ACTION_KEY",
    "CODEBASE_VERSION",
    "DATA_FILES_SIZE_IN_MB",
    "DATA_PATH",
    "DEFAULT_DEPTH_MAX_M",
    "DEPTH_KEY",
    "EPISODES_PATH",
    "EPISODE_FILE",
    "EPISODE_FORMAT",
    "FRAMES_FILE",
    "MASK_KEY",
    "RGB_KEY",
    "STATE_DIM",
    "STATE_KEY",
    "VIDEO_FILES_SIZE_IN_MB",
    "VIDEO_KEYS",
    "VIDEO_PATH",
    "data_schema",
    "depth_to_gray",
    "features",
    "frame_schema",
    "gray_to_depth",
    "video_file",
]

CODEBASE_VERSION = "v3.0"
RGB_KEY = "observation.images.rgb"
DEPTH_KEY = "observation.images.depth"
STATE_KEY = "observation.state"
ACTION_KEY = "action"
MASK_KEY = "action_mask"
VIDEO_KEYS = (RGB_KEY, DEPTH_KEY)
VIDEO_FILES_SIZE_IN_MB = 200.0  # a dataset's video file is closed once it would pass this
DATA_FILES_SIZE_IN_MB = 100.0  # and a data file
STATE_DIM = 9
DEFAULT_DEPTH_MAX_M = 10.0

DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"

# Files of one committed episode (one task's output in the OutputStore).
FRAMES_FILE = "frames.parquet"
EPISODE_FILE = "episode.json"
EPISODE_FORMAT = "troupe.lerobot_episode/1"

_STATE_NAMES = [f"ego.pos.{a}" for a in "xyz"] + [f"ego.rot6d.{i}" for i in range(6)]
_INDEX_KEYS = ("frame_index", "episode_index", "index", "task_index")


def video_file(key: str) -> str:
    """Return the file name of a video feature inside a committed episode."""
    return f"{key}.mp4"


def frame_schema() -> pa.Schema:
    """Arrow schema of one committed episode's frame rows (indices assigned at finalize)."""
    import pyarrow as pa  # here: see troupe.actors.lerobot's docstring

    return pa.schema(
        [
            (STATE_KEY, pa.list_(pa.float32(), STATE_DIM)),
            (ACTION_KEY, pa.list_(pa.float32(), ACTION_DIM)),
            (MASK_KEY, pa.list_(pa.bool_(), ACTION_DIM)),
            ("timestamp", pa.float32()),
            ("frame_index", pa.int64()),
        ]
    )


def data_schema() -> pa.Schema:
    """Arrow schema of the dataset's ``data/`` files: the frame rows plus global indices."""
    import pyarrow as pa

    schema = frame_schema()
    for name in ("episode_index", "index", "task_index"):
        schema = schema.append(pa.field(name, pa.int64()))
    return schema


def depth_to_gray(depth: npt.NDArray[np.floating[Any]], depth_max_m: float) -> npt.NDArray[np.uint8]:
    """Quantise metres to 8-bit levels over ``[0, depth_max_m]`` (see the module docstring)."""
    d = np.nan_to_num(depth.astype(np.float32), nan=0.0, posinf=depth_max_m, neginf=0.0)
    levels: npt.NDArray[np.uint8] = np.rint(np.clip(d, 0.0, depth_max_m) * (255.0 / depth_max_m)).astype(
        np.uint8
    )
    return levels


def gray_to_depth(gray: npt.NDArray[np.uint8], depth_max_m: float) -> npt.NDArray[np.float32]:
    """Map decoded 8-bit levels back to metres (take any one channel of a decoded frame)."""
    return (gray.astype(np.float32) * np.float32(depth_max_m / 255.0)).astype(np.float32)


def _video_feature(video: dict[str, Any], fps: int, depth_max_m: float | None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "video.height": video["height"],
        "video.width": video["width"],
        "video.codec": codec_name(video["codec"]),  # an episode committed before: "libx264"
        "video.pix_fmt": video["pix_fmt"],
        "video.is_depth_map": depth_max_m is not None,
        "video.fps": fps,
        "video.channels": 3,
        "has_audio": False,
    }
    if depth_max_m is not None:
        info["depth.max_m"] = depth_max_m
        info["depth.unit"] = "m"
        info["depth.encoding"] = "gray8_linear: metres = level / 255 * depth.max_m"
    return {
        "dtype": "video",
        "shape": [video["height"], video["width"], 3],
        "names": ["height", "width", "channels"],
        "info": info,
    }


def features(videos: dict[str, dict[str, Any]], fps: int, depth_max_m: float) -> dict[str, Any]:
    """Return the ``features`` entry of ``meta/info.json``.

    Args:
        videos: per video key, the encoded video's fields (height, width, codec, pix_fmt).
        fps: the dataset's frame rate.
        depth_max_m: the depth quantisation range, recorded in the depth feature's info.

    Returns:
        Feature name -> ``{dtype, shape, names[, info]}``, JSON-ready.
    """
    out: dict[str, Any] = {
        RGB_KEY: _video_feature(videos[RGB_KEY], fps, None),
        DEPTH_KEY: _video_feature(videos[DEPTH_KEY], fps, depth_max_m),
        STATE_KEY: {"dtype": "float32", "shape": [STATE_DIM], "names": list(_STATE_NAMES)},
        ACTION_KEY: {"dtype": "float32", "shape": [ACTION_DIM], "names": list(ACTION_NAMES)},
        MASK_KEY: {"dtype": "bool", "shape": [ACTION_DIM], "names": list(ACTION_NAMES)},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    }
    for key in _INDEX_KEYS:
        out[key] = {"dtype": "int64", "shape": [1], "names": None}
    return out
