"""The dataset's ``meta/`` files: ``meta/episodes`` (a row per episode: its indices, its data
and video files and spans, its statistics, and troupe's ``troupe/task_id`` and ``troupe/extra``),
``tasks.parquet`` and ``stats.json`` (the episodes' statistics stacked); ``info.json`` withdrawn
before the first file is replaced; and the files of an earlier, larger run removed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from troupe.actors.lerobot.errors import InvalidData
from troupe.runtime.tasks.output_store import atomic_file, fsync_path

from .finalize_episodes import Episode, damaged, file_slot
from .format import EPISODES_PATH
from .stats import Stats, stats_from_json
from .stats_columns import index_stats, list_column, stacked_stats

if TYPE_CHECKING:
    from .finalize import DatasetConfig

__all__ = [
    "episode_stats",
    "remove_stale",
    "withdraw_info",
    "write_episodes_meta",
    "write_json",
    "write_tasks",
]


def episode_stats(episodes: list[Episode]) -> dict[str, Stats]:
    """Every episode's statistics, its own and those of the columns finalize adds, stacked
    (``stats_columns``): features in ``episode.json``'s order, then the added columns."""
    try:
        columns = stacked_stats([ep.meta["stats"] for ep in episodes])
    except (AttributeError, KeyError, ValueError, TypeError):
        raise _stats_unlike(episodes) from None
    where = np.array([(ep.length, ep.start, ep.index, ep.task_index) for ep in episodes], dtype=np.int64)
    columns.update(index_stats(*where.T))
    return columns


def _stats_unlike(episodes: list[Episode]) -> InvalidData:
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
            return InvalidData(damaged(ep.meta["task_id"], ep.path, said))
    return InvalidData(f"the episodes' statistics in {episodes[0].path.parent} cannot be stacked")


def _stats_shapes(ep: Episode) -> dict[str, dict[str, tuple[int, ...]]] | None:
    try:
        stats = stats_from_json(ep.meta["stats"])
    except (AttributeError, KeyError, ValueError, TypeError):
        return None
    return {feature: {k: np.shape(v) for k, v in s.items()} for feature, s in stats.items()}


def _meta_row(
    ep: Episode,
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


def write_episodes_meta(
    root: Path,
    episodes: list[Episode],
    stats: dict[str, Stats],
    data_where: dict[int, dict[str, int]],
    video_columns: dict[int, dict[str, Any]],
    cfg: DatasetConfig,
) -> set[Path]:
    written: set[Path] = set()
    per_file = max(1, cfg.episodes_per_meta_file)
    for n, first in enumerate(range(0, len(episodes), per_file)):
        slot = file_slot(n, cfg.chunks_size)
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


def write_json(dest: Path, data: Any) -> None:
    with atomic_file(dest) as tmp:
        tmp.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")


def write_tasks(dest: Path, tasks: list[str]) -> None:
    with atomic_file(dest) as tmp:
        frame = pd.DataFrame({"task_index": np.arange(len(tasks), dtype=np.int64)}, index=tasks)
        frame.to_parquet(tmp)


def withdraw_info(root: Path) -> None:
    """Remove ``meta/info.json`` (durably) before the first file is replaced: a dataset
    finalized before is rewritten file by file, and a kill halfway left a folder LeRobot opened
    and misread (one episode's frames beside another's actions). Without info.json LeRobot and
    troupe's readers refuse it, and a rerun, which finds that output gone, finalizes again."""
    info = root / "meta" / "info.json"
    if not info.is_file():
        return
    info.unlink()
    fsync_path(info.parent)


def remove_stale(root: Path, keep: set[Path]) -> None:
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
