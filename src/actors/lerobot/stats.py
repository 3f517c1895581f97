"""Per-feature statistics in LeRobot's shape: per episode, and aggregated over a dataset.

Each feature gets ``min, max, mean, std, count, q01, q10, q50, q90, q99``. Vectors (T, D) reduce
over time to shape (D,); scalars (T,) to shape (1,). Images and videos, like lerobot's, are
per channel with shape (3, 1, 1), in [0, 1] (levels / 255), computed on a sample of frames
(:data:`MAX_SAMPLED_FRAMES`, strided to about :data:`MAX_SAMPLED_SIDE` pixels a side), and their
``count`` is the number of sampled frames. ``count`` always has shape (1,).

Aggregation follows lerobot's ``aggregate_stats``: min of mins, max of maxes, count-weighted
mean, pooled variance, and count-weighted averages of the quantiles (an approximation of the
dataset quantiles, exact when episodes are alike).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_SAMPLED_FRAMES",
    "MAX_SAMPLED_SIDE",
    "QUANTILES",
    "STAT_KEYS",
    "Stats",
    "aggregate_stacked",
    "aggregate_stats",
    "image_stats",
    "stats_from_json",
    "stats_to_json",
    "vector_stats",
]

Stats = dict[str, npt.NDArray[np.float64]]
"""One feature's statistics: stat name -> array."""

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STAT_KEYS = ("min", "max", "mean", "std", "count", *QUANTILES)
_QS = np.array(list(QUANTILES.values()))
MAX_SAMPLED_FRAMES = 100
MAX_SAMPLED_SIDE = 150


def _reduce(values: npt.NDArray[np.float64], axis: tuple[int, ...], count: int) -> Stats:
    out: Stats = {
        "min": values.min(axis=axis),
        "max": values.max(axis=axis),
        "mean": values.mean(axis=axis),
        "std": values.std(axis=axis),
        "count": np.array([count], dtype=np.int64),
    }
    # One call for every quantile: a sort per call is most of a small episode's stats.
    for name, value in zip(QUANTILES, np.quantile(values, _QS, axis=axis), strict=True):
        out[name] = value
    return out


def vector_stats(values: npt.ArrayLike) -> Stats:
    """Statistics over time of a (T,) scalar or (T, D) vector feature.

    Args:
        values: T >= 1 rows; bools count as 0/1.

    Returns:
        Arrays of shape (1,) for a scalar feature, (D,) for a vector one.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    return _reduce(arr, (0,), len(arr))


def image_stats(frames: npt.NDArray[np.uint8]) -> Stats:
    """Per-channel statistics of (T, H, W, C) uint8 frames, in [0, 1], shape (C, 1, 1).

    Args:
        frames: T >= 1 frames; at most :data:`MAX_SAMPLED_FRAMES` evenly spaced ones are used.
    """
    picks = np.unique(np.linspace(0, len(frames) - 1, min(len(frames), MAX_SAMPLED_FRAMES)).round())
    stride = max(1, max(frames.shape[1:3]) // MAX_SAMPLED_SIDE)
    sample = frames[picks.astype(np.int64), ::stride, ::stride, :]
    stats = _level_stats(_channel_histograms(sample))
    stats["count"] = np.array([len(sample)], dtype=np.int64)
    return {k: v if k == "count" else v.reshape(-1, 1, 1) for k, v in stats.items()}


_LEVELS = np.arange(256, dtype=np.float64) / 255.0


def _channel_histograms(sample: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
    """(C, 256) counts of each level per channel of (..., C) uint8 pixels, in one pass."""
    channels = sample.shape[-1]
    offsets = np.arange(channels, dtype=np.intp) * 256
    keys = sample.reshape(-1, channels).astype(np.intp) + offsets
    return np.bincount(keys.ravel(), minlength=256 * channels).reshape(channels, 256).astype(np.int64)


def _level_stats(hist: npt.NDArray[np.int64]) -> Stats:
    """What :func:`_reduce` gives for pixels levels / 255, from their (C, 256) histograms.

    Exact, and about twenty times cheaper than reducing the pixels as floats (a sort for the
    quantiles, five passes over eight bytes a pixel for the rest), which was most of an
    episode's write. The quantiles interpolate as ``np.quantile``'s default ("linear") does.
    """
    n = int(hist[0].sum())
    seen = hist > 0
    mean = (hist @ _LEVELS) / n
    var = (hist * (_LEVELS[None, :] - mean[:, None]) ** 2).sum(axis=1) / n
    out: Stats = {
        "min": _LEVELS[seen.argmax(axis=1)],
        "max": _LEVELS[255 - seen[:, ::-1].argmax(axis=1)],
        "mean": mean,
        "std": np.sqrt(var),
    }
    cum = hist.cumsum(axis=1)
    position = (n - 1) * _QS
    below = np.floor(position)
    t = position - below
    lo, hi = below.astype(np.int64), np.minimum(below.astype(np.int64) + 1, n - 1)
    for name, ranks_lo, ranks_hi, frac in zip(QUANTILES, lo, hi, t, strict=True):
        a = _LEVELS[[np.searchsorted(c, ranks_lo, side="right") for c in cum]]
        b = _LEVELS[[np.searchsorted(c, ranks_hi, side="right") for c in cum]]
        # np.quantile's lerp: from the nearer end, so that t = 1 gives b exactly.
        out[name] = b - (b - a) * (1 - frac) if frac >= 0.5 else a + (b - a) * frac
    return out


def aggregate_stats(per_episode: Sequence[Mapping[str, Stats]]) -> dict[str, Stats]:
    """Combine per-episode statistics into dataset statistics, feature by feature.

    Args:
        per_episode: one ``{feature: stats}`` mapping per episode; features missing from some
            episodes are aggregated over those that have them.

    Returns:
        ``{feature: stats}`` with the same shapes as the inputs.
    """
    keys = sorted({k for ep in per_episode for k in ep})
    stacked = {}
    for key in keys:
        items = [ep[key] for ep in per_episode if key in ep]
        stacked[key] = {name: np.stack([s[name] for s in items]) for name in STAT_KEYS}
    return aggregate_stacked(stacked)


def aggregate_stacked(stacked: Mapping[str, Stats]) -> dict[str, Stats]:
    """:func:`aggregate_stats` of statistics held per feature and statistic, stacked over the
    episodes (``(E, *shape)``: ``stats_columns``), which gives the same figures.

    Returns:
        ``{feature: stats}``, features sorted, each statistic of one episode's shape.
    """
    return {key: _aggregate(stacked[key]) for key in sorted(stacked)}


def _aggregate(stacked: Stats) -> Stats:
    counts = stacked["count"][:, 0].astype(np.float64)
    total = counts.sum()
    w = counts.reshape((-1,) + (1,) * (stacked["mean"].ndim - 1))
    means = stacked["mean"]
    mean = (means * w).sum(axis=0) / total
    var = ((stacked["std"] ** 2 + (means - mean) ** 2) * w).sum(0) / total
    agg: Stats = {
        "min": np.min(stacked["min"], axis=0),
        "max": np.max(stacked["max"], axis=0),
        "mean": mean,
        "std": np.sqrt(var),
        "count": np.array([int(total)], dtype=np.int64),
    }
    for name in QUANTILES:
        agg[name] = (stacked[name] * w).sum(axis=0) / total
    return agg


def stats_to_json(stats: Mapping[str, Stats]) -> dict[str, dict[str, Any]]:
    """Turn ``{feature: stats}`` into nested lists, as ``meta/stats.json`` stores them."""
    return {f: {k: np.asarray(v).tolist() for k, v in s.items()} for f, s in stats.items()}


def stats_from_json(data: Mapping[str, Mapping[str, Any]]) -> dict[str, Stats]:
    """Inverse of :func:`stats_to_json`."""
    return {
        f: {k: np.asarray(v, dtype=np.int64 if k == "count" else np.float64) for k, v in s.items()}
        for f, s in data.items()
    }
