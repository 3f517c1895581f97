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
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from troupe.actors.lerobot.errors import InvalidData
from troupe.runtime.errors import CommitError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.output_store import (
    OutputStore,
    as_commit_error,
    atomic_file,
    fsync_path,
    replace_durably,
)

from .dataset_drafts import DataDraft, DatasetDrafts
from .episode_rows import episode_rows
from .format import (
    CODEBASE_VERSION,
    DATA_FILES_SIZE_IN_MB,
    DATA_PATH,
    EPISODE_FILE,
    EPISODE_FORMAT,
    EPISODES_PATH,
    FRAMES_FILE,
    VIDEO_FILES_SIZE_IN_MB,
    VIDEO_KEYS,
    VIDEO_PATH,
    data_schema,
    features,
    video_file,
)
from .stats import Stats, aggregate_stacked, stats_from_json, stats_to_json
from .stats_columns import index_stats, list_column, stacked_stats
from .video import SignatureMismatch, VideoConcat, concat_videos, video_signature

__all__ = ["DatasetConfig", "DatasetSummary", "episode_fps", "finalize_dataset"]

log = get_logger(__name__)

_MB = 1024 * 1024


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


@dataclass(frozen=True)
class _Episode:
    index: int
    path: Path
    meta: dict[str, Any]
    task_index: int
    start: int  # global index of its first frame

    @property
    def length(self) -> int:
        return int(self.meta["length"])


def _file_slot(n: int, chunks_size: int) -> dict[str, int]:
    return {"chunk_index": n // chunks_size, "file_index": n % chunks_size}


def _groups(
    items: list[_Episode],
    size: Callable[[_Episode], int],
    limit: float,
    key: Callable[[_Episode], object],
) -> Iterator[list[_Episode]]:
    """Split consecutive episodes into files: a new one past ``limit`` bytes or on a new key."""
    group: list[_Episode] = []
    total = 0
    for ep in items:
        nbytes = size(ep)  # once: a stat each time
        if group and (total + nbytes > limit or key(ep) != key(group[0])):
            yield group
            group, total = [], 0
        group.append(ep)
        total += nbytes
    if group:
        yield group


def _load(
    store: OutputStore, task_ids: list[str], fps: int, drafts: DatasetDrafts | None = None
) -> tuple[list[_Episode], list[str], list[str]]:
    episodes: list[_Episode] = []
    tasks: dict[str, int] = {}
    skipped: list[str] = []
    start = 0
    for task_id in task_ids:
        path = store.committed_path(task_id)
        if not (path / EPISODE_FILE).is_file():
            skipped.append(task_id)
            log.warning("finalize_skipped_output", task_id=task_id, reason="no episode.json")
            continue
        meta = drafts.take_meta(path) if drafts is not None else None
        if meta is None:
            meta = _read_meta(task_id, path)
        if not isinstance(meta, dict) or meta.get("format") != EPISODE_FORMAT:
            raise InvalidData(
                f"committed output {task_id!r} has format "
                f"{meta.get('format') if isinstance(meta, dict) else None!r}, not "
                f"{EPISODE_FORMAT!r}; rewrite it with this troupe version"
            )
        if meta["fps"] != fps:
            raise InvalidData(
                f"episode {task_id!r} is at {meta['fps']} fps but the dataset is at {fps}; "
                "finalize episodes of one fps per dataset"
            )
        task_index = tasks.setdefault(meta["task"], len(tasks))
        episodes.append(_Episode(len(episodes), path, meta, task_index, start))
        start += int(meta["length"])
    return episodes, list(tasks), skipped


def _read_meta(task_id: str, path: Path) -> Any:
    try:
        return json.loads((path / EPISODE_FILE).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        said = f"{path / EPISODE_FILE} is not its JSON ({exc})"
        raise InvalidData(_damaged(task_id, path, said)) from None


def _damaged(task_id: str, path: Path, what: str) -> str:
    """The error of an episode damaged since its commit in a way its files' sizes do not show
    (those are set aside as a run starts): which, what is wrong, and the way out."""
    return (
        f"committed episode {task_id!r} is damaged: {what}; delete {path} and run the same command "
        "again, which makes that episode again (--fresh would make every episode anew)"
    )


def _check_uniform(episodes: list[_Episode]) -> dict[str, dict[str, Any]]:
    first = episodes[0].meta
    for ep in episodes[1:]:
        for key in VIDEO_KEYS:
            a, b = first["videos"][key], ep.meta["videos"][key]
            if (a["height"], a["width"]) != (b["height"], b["width"]):
                raise InvalidData(
                    f"episode {ep.meta['task_id']!r} has {key} at {b['width']}x{b['height']} but "
                    f"{first['task_id']!r} at {a['width']}x{a['height']}; one size per dataset"
                )
        if ep.meta["depth_max_m"] != first["depth_max_m"]:
            raise InvalidData(
                f"episode {ep.meta['task_id']!r} quantised depth to {ep.meta['depth_max_m']} m, "
                f"others to {first['depth_max_m']} m; use one EpisodeConfig per dataset"
            )
    return dict(first["videos"])


def _write_data(
    root: Path, episodes: list[_Episode], cfg: DatasetConfig, drafts: DatasetDrafts | None = None
) -> tuple[set[Path], dict[int, dict[str, int]]]:
    schema = data_schema()
    written: set[Path] = set()
    where: dict[int, dict[str, int]] = {}
    groups = _groups(
        episodes,
        lambda ep: (ep.path / FRAMES_FILE).stat().st_size,
        cfg.data_files_size_in_mb * _MB,
        lambda ep: None,
    )
    for n, group in enumerate(groups):
        slot = _file_slot(n, cfg.chunks_size)
        dest = root / DATA_PATH.format(**slot)
        paths = [ep.path for ep in group]
        draft = drafts.take_data(n, paths) if drafts is not None else None
        if draft is None or not _finish_data_draft(draft, group, schema, dest):
            with atomic_file(dest) as tmp, pq.ParquetWriter(tmp, schema) as writer:
                for ep in group:
                    writer.write_table(_rows(ep, schema))
        for ep in group:
            where[ep.index] = slot
        written.add(dest)
    return written, where


def _write_videos(
    root: Path, episodes: list[_Episode], cfg: DatasetConfig, drafts: DatasetDrafts | None
) -> tuple[set[Path], dict[int, dict[str, Any]]]:
    written: set[Path] = set()
    columns: dict[int, dict[str, Any]] = {ep.index: {} for ep in episodes}
    for key in VIDEO_KEYS:
        written |= _write_video_key(root, key, episodes, cfg, columns, drafts if cfg.remux_videos else None)
    return written, columns


def _write_video_key(
    root: Path,
    key: str,
    episodes: list[_Episode],
    cfg: DatasetConfig,
    columns: dict[int, dict[str, Any]],
    drafts: DatasetDrafts | None = None,
) -> set[Path]:
    sources = {ep.index: ep.path / video_file(key) for ep in episodes}
    if not cfg.remux_videos:  # a file per episode
        return _write_video_files(root, key, episodes, cfg, columns, sources, lambda ep: None)
    # Episodes whose codec headers differ cannot share a stream: they start a new file. What
    # each episode.json declares splits them without opening every video; the remux checks
    # the whole signature on the files it opens anyway, and a difference the declarations
    # missed (codec headers, a damaged episode.json) sends us to the files themselves.
    declared = _declared_signatures(episodes, key)
    if declared is not None:
        try:
            return _write_video_files(root, key, episodes, cfg, columns, sources, declared.get, drafts)
        except SignatureMismatch:
            log.info("finalize_video_signatures_read", key=key)
    signatures = {i: video_signature(p) for i, p in sources.items()}
    return _write_video_files(root, key, episodes, cfg, columns, sources, signatures.get)


def _declared_signatures(episodes: list[_Episode], key: str) -> dict[int, object] | None:
    try:
        return {
            ep.index: tuple(str(ep.meta["videos"][key][f]) for f in ("codec", "width", "height", "pix_fmt"))
            for ep in episodes
        }
    except (KeyError, TypeError):
        return None


def _write_video_files(
    root: Path,
    key: str,
    episodes: list[_Episode],
    cfg: DatasetConfig,
    columns: dict[int, dict[str, Any]],
    sources: dict[int, Path],
    signature: Callable[[int], object],
    drafts: DatasetDrafts | None = None,
) -> set[Path]:
    written: set[Path] = set()
    limit = cfg.video_files_size_in_mb * _MB if cfg.remux_videos else 0
    groups = _groups(
        episodes,
        lambda ep: sources[ep.index].stat().st_size,
        limit,
        lambda ep: signature(ep.index),
    )
    for n, group in enumerate(groups):
        slot = _file_slot(n, cfg.chunks_size)
        dest = root / VIDEO_PATH.format(video_key=key, **slot)
        paths = [sources[ep.index] for ep in group]
        draft = drafts.take(key, n, paths, cfg.fps) if drafts is not None else None
        spans = _finish_draft(draft, paths, dest) if draft is not None else None
        if spans is None:
            with atomic_file(dest) as tmp:
                spans = concat_videos(paths, tmp, cfg.fps)
        written.add(dest)
        for ep, (t0, t1) in zip(group, spans, strict=True):
            frames = round((t1 - t0) * cfg.fps)
            if frames != ep.length:
                said = f"its {key} video has {frames} frames but {ep.length} rows"
                raise InvalidData(_damaged(ep.meta["task_id"], ep.path, said))
            columns[ep.index].update(
                {
                    f"videos/{key}/chunk_index": slot["chunk_index"],
                    f"videos/{key}/file_index": slot["file_index"],
                    f"videos/{key}/from_timestamp": t0,
                    f"videos/{key}/to_timestamp": t1,
                }
            )
    return written


def _rows(ep: _Episode, schema: pa.Schema) -> pa.Table:
    try:
        return episode_rows(ep.path, ep.index, ep.start, ep.task_index, schema)
    except (pa.ArrowException, OSError) as exc:
        said = f"{ep.path / FRAMES_FILE} cannot be read ({exc})"
        raise InvalidData(_damaged(ep.meta["task_id"], ep.path, said)) from None


def _finish_data_draft(draft: DataDraft, group: list[_Episode], schema: pa.Schema, dest: Path) -> bool:
    """The data draft with the rest of ``group``'s rows written, moved to ``dest`` (durably);
    False, the draft deleted, where that failed: the file is written anew then."""
    try:
        for ep in group[len(draft.episodes) :]:
            draft.writer.write_table(_rows(ep, schema))
        draft.writer.close()
        dest.parent.mkdir(parents=True, exist_ok=True)
        replace_durably(draft.path, dest)
    except (InvalidData, OSError, pa.ArrowException) as exc:
        log.info("data_draft_unused", dest=str(dest), why=f"{type(exc).__name__}: {exc}")
        draft.discard()
        return False
    return True


def _finish_draft(draft: VideoConcat, sources: list[Path], dest: Path) -> list[tuple[float, float]] | None:
    """The draft with the rest of ``sources`` added, moved to ``dest`` (durably, as
    ``atomic_file``): its spans; None, the draft deleted, where that failed (a source that
    differs, another file system): the file is remuxed anew then."""
    try:
        for src in sources[len(draft.sources) :]:
            draft.add(src)
        draft.close()
        dest.parent.mkdir(parents=True, exist_ok=True)
        replace_durably(draft.dest, dest)
    except (InvalidData, OSError) as exc:
        log.info("video_draft_unused", dest=str(dest), why=f"{type(exc).__name__}: {exc}")
        draft.discard()
        return None
    return draft.spans


def _stats_columns(episodes: list[_Episode]) -> dict[str, Stats]:
    """Every episode's statistics, its own and those of the columns finalize adds, stacked
    (``stats_columns``): features in ``episode.json``'s order, then the added columns."""
    try:
        columns = stacked_stats([ep.meta["stats"] for ep in episodes])
    except (AttributeError, KeyError, ValueError, TypeError):
        raise _stats_unlike(episodes) from None
    where = np.array([(ep.length, ep.start, ep.index, ep.task_index) for ep in episodes], dtype=np.int64)
    columns.update(index_stats(*where.T))
    return columns


def _stats_unlike(episodes: list[_Episode]) -> InvalidData:
    """The error for statistics that cannot be stacked: the first episode whose statistics
    are not numbers, or differ from the first episode's in features, statistics or shapes."""
    first = _stats_shapes(episodes[0])
    for ep in episodes:
        shapes = _stats_shapes(ep)
        if shapes is None or shapes != first:
            other = episodes[0].meta["task_id"]
            said = (
                "its statistics are not numbers of one shape each"
                if shapes is None
                else f"its statistics differ from those of {other!r} in features or shapes"
            )
            return InvalidData(_damaged(ep.meta["task_id"], ep.path, said))
    return InvalidData(f"the episodes' statistics in {episodes[0].path.parent} cannot be stacked")


def _stats_shapes(ep: _Episode) -> dict[str, dict[str, tuple[int, ...]]] | None:
    try:
        stats = stats_from_json(ep.meta["stats"])
    except (AttributeError, KeyError, ValueError, TypeError):
        return None
    return {feature: {k: np.shape(v) for k, v in s.items()} for feature, s in stats.items()}


def _meta_row(
    ep: _Episode,
    slot: dict[str, int],
    data_where: dict[int, dict[str, int]],
    video_columns: dict[int, dict[str, Any]],
) -> dict[str, Any]:
    return {
        "episode_index": ep.index,
        "tasks": [ep.meta["task"]],
        "length": ep.length,
        "data/chunk_index": data_where[ep.index]["chunk_index"],
        "data/file_index": data_where[ep.index]["file_index"],
        "dataset_from_index": ep.start,
        "dataset_to_index": ep.start + ep.length,
        **video_columns[ep.index],
        "meta/episodes/chunk_index": slot["chunk_index"],
        "meta/episodes/file_index": slot["file_index"],
        "troupe/task_id": ep.meta["task_id"],
        "troupe/extra": json.dumps(ep.meta.get("extra", {}), sort_keys=True),
    }


def _write_episodes_meta(
    root: Path,
    episodes: list[_Episode],
    stats: dict[str, Stats],
    data_where: dict[int, dict[str, int]],
    video_columns: dict[int, dict[str, Any]],
    cfg: DatasetConfig,
) -> set[Path]:
    written: set[Path] = set()
    per_file = max(1, cfg.episodes_per_meta_file)
    for n, first in enumerate(range(0, len(episodes), per_file)):
        slot = _file_slot(n, cfg.chunks_size)
        rows = [_meta_row(ep, slot, data_where, video_columns) for ep in episodes[first : first + per_file]]
        table = pa.Table.from_pylist(rows)
        names, arrays = list(table.column_names), list(table.columns)
        for feature, feature_stats in stats.items():
            for name, values in feature_stats.items():
                names.append(f"stats/{feature}/{name}")
                arrays.append(list_column(values[first : first + per_file]))
        dest = root / EPISODES_PATH.format(**slot)
        with atomic_file(dest) as tmp:
            pq.write_table(pa.Table.from_arrays(arrays, names=names), tmp)
        written.add(dest)
    return written


def _write_json(dest: Path, data: Any) -> None:
    with atomic_file(dest) as tmp:
        tmp.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")


def _write_tasks(dest: Path, tasks: list[str]) -> None:
    with atomic_file(dest) as tmp:
        frame = pd.DataFrame({"task_index": np.arange(len(tasks), dtype=np.int64)}, index=tasks)
        frame.to_parquet(tmp)


def _withdraw_info(root: Path) -> None:
    """Remove ``meta/info.json`` (durably) before the first file is replaced: a dataset
    finalized before is rewritten file by file, and a kill halfway left a folder LeRobot opened
    and misread (one episode's frames beside another's actions). Without info.json LeRobot and
    troupe's readers refuse it, and a rerun, which finds that output gone, finalizes again."""
    info = root / "meta" / "info.json"
    if not info.is_file():
        return
    info.unlink()
    fsync_path(info.parent)


def _remove_stale(root: Path, keep: set[Path]) -> None:
    # Files of an earlier run with more files, and temporaries of a crashed one.
    for tmp in (root / "meta").glob(".*.tmp"):
        tmp.unlink()
    for top in ("data", "videos", "meta/episodes"):
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and path not in keep:
                path.unlink()
        for path in sorted((root / top).rglob("*"), reverse=True):
            if path.is_dir() and not any(path.iterdir()):
                shutil.rmtree(path)


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
        episodes, tasks, skipped = _load(store, ours, config.fps, drafts)
        if not episodes:
            raise InvalidData(f"no committed episodes in {store.root}; write some with write_episode first")
        videos = _check_uniform(episodes)
        _withdraw_info(root)
        # The data files on a thread of their own while the videos are remuxed here: both
        # spend much of their time in pyarrow and ffmpeg, outside the GIL, and a pipeline's
        # cores are idle by the time its dataset is finalized. The tasks and the statistics
        # go there too, each file's fsyncs beside another's rather than after it.
        with ThreadPoolExecutor(1, thread_name_prefix="finalize-data") as pool:
            data = pool.submit(_write_data, root, episodes, config, drafts)
            tasks_file = pool.submit(_write_tasks, root / "meta" / "tasks.parquet", tasks)
            video_files, video_columns = _write_videos(root, episodes, config, drafts)
            stats = _stats_columns(episodes)
            stats_file = pool.submit(
                _write_json, root / "meta" / "stats.json", stats_to_json(aggregate_stacked(stats))
            )
            data_files, data_where = data.result()
            meta_files = _write_episodes_meta(root, episodes, stats, data_where, video_columns, config)
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
        _remove_stale(root, data_files | video_files | meta_files)
        _write_json(root / "meta" / "info.json", info)
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
