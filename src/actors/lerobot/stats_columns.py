"""A dataset's per-episode statistics as columns: per feature and statistic, one array of every
episode's values, episode first (``(E, *shape)``).

Finalize writes each into ``meta/episodes`` (column ``stats/{feature}/{stat}``) and aggregates
them into ``meta/stats.json`` (:func:`~troupe.actors.lerobot.stats.aggregate_stacked`). Held
per episode, the same figures cost a few numpy and Arrow calls per episode and column, which
was most of finalize's work on the statistics; as columns, a few per column. The figures, and
so the files, are the same either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .stats import Stats, vector_stats

__all__ = ["INDEX_COLUMNS", "index_stats", "list_column", "stacked_stats"]

INDEX_COLUMNS = ("episode_index", "index", "task_index")
"""The columns finalize adds to an episode's frames, in the order of their statistics."""


def stacked_stats(per_episode: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, Stats]:
    """Episodes' statistics as ``stats_to_json`` gives them, stacked: ``{feature: {stat: (E,
    *shape)}}``, features and statistics in the first episode's order, ``count`` int64 and
    the others float64 (as ``stats_from_json`` reads them).

    Raises:
        ValueError: the episodes' values of one statistic are not numbers of one shape.
        KeyError: an episode's features or statistics are not the first's.
    """
    first = per_episode[0]
    for ep in per_episode:
        if ep.keys() != first.keys() or any(ep[f].keys() != first[f].keys() for f in first):
            raise KeyError("the episodes' statistics differ in features or statistics")
    return {
        feature: {
            name: np.array(
                [ep[feature][name] for ep in per_episode], dtype=np.int64 if name == "count" else np.float64
            )
            for name in stats
        }
        for feature, stats in first.items()
    }


def index_stats(
    lengths: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    episode_index: npt.NDArray[np.int64],
    task_index: npt.NDArray[np.int64],
) -> dict[str, Stats]:
    """The statistics of :data:`INDEX_COLUMNS` per episode, stacked as :func:`stacked_stats`:
    episode ``i`` has ``lengths[i]`` frames, all of episode ``episode_index[i]`` and task
    ``task_index[i]``, at global indices from ``starts[i]``.

    The episodes of one length are reduced together, every column of theirs in one
    :func:`vector_stats` call: each column's figures are those it has alone (its values are
    small integers, so every sum is exact; the quantiles are taken column by column).
    """
    out: dict[str, Stats] = {name: {} for name in INDEX_COLUMNS}
    for length in np.unique(lengths):
        picks = np.flatnonzero(lengths == length)
        columns = np.empty((int(length), 3 * len(picks)), dtype=np.float64)
        columns[:, 0::3] = episode_index[picks]
        columns[:, 1::3] = starts[picks] + np.arange(length)[:, None]
        columns[:, 2::3] = task_index[picks]
        for stat, values in vector_stats(columns).items():
            for i, name in enumerate(INDEX_COLUMNS):
                column = out[name].setdefault(stat, _empty_column(len(lengths), values.dtype))
                column[picks, 0] = values[0] if stat == "count" else values[i::3]
    return out


def _empty_column(episodes: int, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    return np.empty((episodes, 1), dtype=dtype)


def list_column(values: npt.NDArray[Any]) -> pa.Array:
    """``(E, *shape)`` values as an Arrow column of E nested lists: the array, and type,
    ``pa.array(values.tolist())`` gives, without a Python object per number."""
    column: pa.Array = pa.array(values.reshape(-1))
    for size in reversed(values.shape[1:]):
        offsets = np.arange(0, len(column) + 1, size, dtype=np.int32)
        column = pa.ListArray.from_arrays(pa.array(offsets), column)
    return column
