"""Statistics held as columns stacked over episodes (``stats_columns``) give the figures, and
the Arrow columns, that per-episode statistics give: bit for bit, so the dataset is the same."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest

from troupe.actors.lerobot.stats import (
    aggregate_stacked,
    aggregate_stats,
    image_stats,
    stats_from_json,
    stats_to_json,
    vector_stats,
)
from troupe.actors.lerobot.stats_columns import INDEX_COLUMNS, index_stats, list_column, stacked_stats


def _episodes_stats(seed: int, episodes: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(episodes):
        length = int(rng.integers(1, 30))
        frames = rng.integers(0, 256, size=(length, 8, 8, 3), dtype=np.uint8)
        out.append(
            stats_to_json(
                {
                    "image": image_stats(frames),
                    "vector": vector_stats(rng.normal(size=(length, 5)).astype(np.float32)),
                    "scalar": vector_stats(rng.normal(size=length)),
                }
            )
        )
    return out


def test_stacked_stats_are_each_episodes_stacked_and_aggregate_the_same() -> None:
    per_episode = _episodes_stats(0, 9)
    stacked = stacked_stats(per_episode)
    assert list(stacked) == list(per_episode[0])
    for i, ep in enumerate(per_episode):
        for feature, stats in stats_from_json(ep).items():
            assert list(stacked[feature]) == list(stats)
            for name, value in stats.items():
                assert stacked[feature][name][i].dtype == value.dtype
                np.testing.assert_array_equal(stacked[feature][name][i], value, strict=True)
    expected = stats_to_json(aggregate_stats([stats_from_json(ep) for ep in per_episode]))
    assert stats_to_json(aggregate_stacked(stacked)) == expected


@pytest.mark.parametrize(
    "damage",
    [
        lambda ep: ep.pop("scalar"),
        lambda ep: ep["vector"].pop("q50"),
        lambda ep: ep.update(extra=ep["scalar"]),
        lambda ep: ep["vector"]["min"].append(0.0),
    ],
    ids=["feature gone", "statistic gone", "feature more", "shape"],
)
def test_stacked_stats_refuse_episodes_unlike_the_first(damage: Callable[[dict], object]) -> None:
    per_episode = _episodes_stats(1, 3)
    damage(per_episode[2])
    with pytest.raises((KeyError, ValueError)):
        stacked_stats(per_episode)


def test_index_stats_are_those_of_each_episodes_columns_alone() -> None:
    """Episodes of one length are reduced together; each gets its columns' own figures."""
    rng = np.random.default_rng(2)
    lengths = rng.choice([1, 2, 7, 40, 41], size=30)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) + 10**9  # large global indices too
    episode_index = np.arange(30) + 5
    task_index = rng.integers(0, 4, size=30)
    got = index_stats(lengths, starts, episode_index, task_index)
    assert list(got) == list(INDEX_COLUMNS)
    for i, length in enumerate(lengths):
        columns = {
            "episode_index": np.full(length, episode_index[i]),
            "index": np.arange(starts[i], starts[i] + length),
            "task_index": np.full(length, task_index[i]),
        }
        for name, values in columns.items():
            expected = vector_stats(values)
            assert list(got[name]) == list(expected)
            for stat, value in expected.items():
                np.testing.assert_array_equal(got[name][stat][i], value, strict=True)


@pytest.mark.parametrize("shape", [(4, 1), (4, 59), (4, 3, 1, 1), (2, 2, 3)])
@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_list_column_is_what_pyarrow_makes_of_the_lists(shape: tuple[int, ...], dtype: type) -> None:
    values = (np.arange(np.prod(shape)).reshape(shape) / 3).astype(dtype)
    column = list_column(values)
    expected = pa.array(values.tolist())
    assert column.type == expected.type
    assert column.equals(expected)
    assert list_column(values[1:]).equals(pa.array(values[1:].tolist()))  # a file's episodes
