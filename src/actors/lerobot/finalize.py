"""Consolidate every committed episode of an OutputStore into a LeRobot v3.0 dataset.

Episodes are ordered by task id, which fixes episode indices, task indices (order of first
appearance), the global frame ``index`` (contiguous from 0) and the file layout, so running
finalize again over the same committed episodes writes the same bytes (idempotent), and over
more committed episodes simply rebuilds a larger dataset.

Layout (shared/LEROBOT_V3.md): ``data/chunk-XXX/file-YYY.parquet`` with many episodes per file
(a new file past ``data_files_size_in_mb``); per video key ``videos/{key}/chunk-XXX/file-YYY.mp4``
with many episodes *remuxed* end to end (no re-encoding; a new file past
``video_files_size_in_mb`` or when an episode's codec headers differ), each episode's span given
by ``videos/{key}/from_timestamp`` and ``to_timestamp``; ``meta/episodes``, ``meta/tasks.parquet``,
``meta/stats.json`` and ``meta/info.json``. With ``remux_videos=False`` every episode gets its
own mp4 and from_timestamp 0. Files go to chunk ``n // chunks_size``, file ``n % chunks_size``.

Every file is written to a temporary sibling and ``os.replace``-d, so a crash never leaves half
a file. ``info.json`` is removed before the first file is replaced and written last, after the
files of an earlier, larger run are removed: while finalize runs, and after a crash in it, the
files may mix two runs, and the folder has no info.json, which readers refuse (a
``LeRobotClips`` on a run's ``--out`` reads its committed episodes then). After a crash, run
finalize again. ``root`` belongs to finalize: any other file under ``data/``,
``videos/`` or ``meta/episodes/`` is removed.

Besides lerobot's columns, ``meta/episodes`` carries ``troupe/task_id`` and ``troupe/extra`` (the
episode's extra info as JSON); lerobot ignores them.

The parts: :mod:`.finalize_episodes` (the committed episodes loaded and checked, and grouped into
files), :mod:`.finalize_data` (the parquet files), :mod:`.finalize_videos` (the mp4 files) and
:mod:`.finalize_meta` (``meta/``, the statistics, info.json withdrawn, stale files removed).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from troupe.actors.lerobot.errors import InvalidData
from troupe.runtime.errors import CommitError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.output_store import OutputStore, as_commit_error

from .dataset_drafts import DatasetDrafts
from .finalize_data import write_data
from .finalize_episodes import check_uniform, load_episodes
from .finalize_meta import (
    episode_stats,
    remove_stale,
    withdraw_info,
    write_episodes_meta,
    write_json,
    write_tasks,
)
from .finalize_videos import write_videos
from .format import (
    CODEBASE_VERSION,
    DATA_FILES_SIZE_IN_MB,
    DATA_PATH,
    EPISODE_FILE,
    VIDEO_FILES_SIZE_IN_MB,
    VIDEO_PATH,
    features,
)
from .stats import aggregate_stacked, stats_to_json

__all__ = ["DatasetConfig", "DatasetSummary", "episode_fps", "finalize_dataset"]

log = get_logger(__name__)


@dataclass(frozen=True)
class DatasetConfig:
    """What the finalized dataset declares and how it splits files.

    Attributes:
        fps: frame rate every episode must have.
        robot_type: recorded in info.json.
        chunks_size: files per chunk directory (lerobot's default 1000).
        data_files_size_in_mb: a data parquet file is closed once it would pass this.
        video_files_size_in_mb: a video file is closed once it would pass this.
        remux_videos: concatenate episodes into shared mp4s; False gives one mp4 per episode.
        episodes_per_meta_file: rows per ``meta/episodes`` parquet file.
    """

    fps: int
    robot_type: str = "unknown"
    chunks_size: int = 1000
    data_files_size_in_mb: float = DATA_FILES_SIZE_IN_MB
    video_files_size_in_mb: float = VIDEO_FILES_SIZE_IN_MB
    remux_videos: bool = True
    episodes_per_meta_file: int = 1000


@dataclass(frozen=True)
class DatasetSummary:
    """What :func:`finalize_dataset` wrote.

    Attributes:
        root: the dataset directory.
        total_episodes: episodes in the dataset.
        total_frames: frames in the dataset.
        total_tasks: distinct task strings.
        data_files: parquet files under data/.
        video_files: mp4 files under videos/, all keys together.
        task_ids: the committed task of each episode, by episode index.
        skipped: committed outputs that are not episodes (no episode.json), left out.
        strays: committed episodes that are none of the run's items (``task_ids``), left out.
        files: every file written, meta/info.json last (a rerun that finds one changed or gone
            writes the dataset again).
    """

    root: Path
    total_episodes: int
    total_frames: int
    total_tasks: int
    data_files: int
    video_files: int
    task_ids: tuple[str, ...]
    skipped: tuple[str, ...]
    files: tuple[Path, ...] = ()
    strays: tuple[str, ...] = ()


def episode_fps(store: OutputStore, task_ids: Collection[str] | None = None) -> int | None:
    """The frame rate of the first committed episode (of ``task_ids``, where given; None when
    there is none or it is unreadable)."""
    for task_id in store.committed():
        if task_ids is not None and task_id not in task_ids:
            continue
        try:
            meta = json.loads((store.committed_path(task_id) / EPISODE_FILE).read_text(encoding="utf-8"))
            return int(meta["fps"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def finalize_dataset(
    store: OutputStore,
    root: Path,
    config: DatasetConfig,
    drafts: DatasetDrafts | None = None,
    task_ids: Collection[str] | None = None,
) -> DatasetSummary:
    """Write every committed episode of ``store`` as one LeRobot v3.0 dataset under ``root``.

    Args:
        store: the OutputStore the episodes were committed to.
        root: the dataset directory (``LeRobotDataset(repo_id, root=root)``); created if missing.
        config: frame rate, robot type and file sizes.
        drafts: the files written as the episodes were committed (``dataset_drafts``): a
            draft that begins a data or video file is finished and moved into place, not
            written anew; the episode.json files they read as the episodes were committed are
            not read again.
        task_ids: the run's items: a committed episode of another task id (another run's,
            copied in) is left out of the dataset and named in the summary's ``strays``, not
            put in a dataset the run's config did not make. None: every committed episode.

    Returns:
        A summary of what was written.

    Raises:
        InvalidData: there are no episodes, or they disagree (fps, video size, depth range),
            or a committed episode is damaged.
        CommitError: a file could not be written (disk full, permissions); run finalize again
            once fixed.
    """
    root = Path(root)
    try:
        if drafts is not None:
            drafts.settle()  # first: the drafts have read the episodes' episode.json
        committed = store.committed()
        strays = [t for t in committed if task_ids is not None and t not in task_ids]
        if strays:
            log.warning("finalize_left_out_strays", count=len(strays), task_ids=strays[:20])
        ours = [t for t in committed if t not in strays]
        episodes, tasks, skipped = load_episodes(store, ours, config.fps, drafts)
        if not episodes:
            raise InvalidData(f"no committed episodes in {store.root}; write some with write_episode first")
        videos = check_uniform(episodes)
        withdraw_info(root)
        # The data files on a thread of their own while the videos are remuxed here: both
        # spend much of their time in pyarrow and ffmpeg, outside the GIL, and a pipeline's
        # cores are idle by the time its dataset is finalized. The tasks and the statistics
        # go there too, each file's fsyncs beside another's rather than after it.
        with ThreadPoolExecutor(1, thread_name_prefix="finalize-data") as pool:
            data = pool.submit(write_data, root, episodes, config, drafts)
            tasks_file = pool.submit(write_tasks, root / "meta" / "tasks.parquet", tasks)
            video_files, video_columns = write_videos(root, episodes, config, drafts)
            stats = episode_stats(episodes)
            stats_file = pool.submit(
                write_json, root / "meta" / "stats.json", stats_to_json(aggregate_stacked(stats))
            )
            data_files, data_where = data.result()
            meta_files = write_episodes_meta(root, episodes, stats, data_where, video_columns, config)
            tasks_file.result()
            stats_file.result()
        total_frames = sum(ep.length for ep in episodes)
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": config.robot_type,
            "total_episodes": len(episodes),
            "total_frames": total_frames,
            "total_tasks": len(tasks),
            "chunks_size": config.chunks_size,
            "data_files_size_in_mb": config.data_files_size_in_mb,
            "video_files_size_in_mb": config.video_files_size_in_mb,
            "fps": config.fps,
            "splits": {"train": f"0:{len(episodes)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH,
            "features": features(videos, config.fps, episodes[0].meta["depth_max_m"]),
        }
        remove_stale(root, data_files | video_files | meta_files)
        write_json(root / "meta" / "info.json", info)
    except OSError as exc:
        if isinstance(exc, CommitError):
            raise
        raise as_commit_error(
            exc,
            action=f"finalizing the dataset at {root}",
            root=root,
            retry="run the same troupe run again, or finalize_dataset (it is idempotent)",
            # Some of the dataset's files may be in place already: whole only once one succeeds.
            kept="The committed episodes are kept; the dataset is whole once a finalize succeeds.",
        ) from exc
    summary = DatasetSummary(
        root=root,
        total_episodes=len(episodes),
        total_frames=total_frames,
        total_tasks=len(tasks),
        data_files=len(data_files),
        video_files=len(video_files),
        task_ids=tuple(ep.meta["task_id"] for ep in episodes),
        skipped=tuple(skipped),
        strays=tuple(strays),
        files=(
            *sorted(data_files | video_files | meta_files),
            root / "meta" / "stats.json",
            root / "meta" / "tasks.parquet",
            root / "meta" / "info.json",
        ),
    )
    log.info("dataset_finalized", root=str(root), episodes=len(episodes), frames=total_frames)
    return summary
