"""Image statistics from per-channel histograms equal those of reducing the pixels as floats.

What a user relies on: ``meta/stats.json`` holds, per channel, the min, max, mean, std and
quantiles of the sampled pixels in [0, 1], as lerobot computes them (``np.quantile``'s default
interpolation), whatever the frames' size, content and number of channels.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from troupe.actors.lerobot.stats import MAX_SAMPLED_FRAMES, MAX_SAMPLED_SIDE, QUANTILES, image_stats


def _reference(frames: npt.NDArray[np.uint8]) -> dict[str, npt.NDArray[np.float64]]:
    """The statistics straight from the sampled pixels as float64 (the definition)."""
    picks = np.unique(np.linspace(0, len(frames) - 1, min(len(frames), MAX_SAMPLED_FRAMES)).round())
    stride = max(1, max(frames.shape[1:3]) // MAX_SAMPLED_SIDE)
    sample = frames[picks.astype(np.int64), ::stride, ::stride, :]
    pixels = np.ascontiguousarray(sample.reshape(-1, sample.shape[-1]).T, dtype=np.float64) / 255.0
    out = {
        "min": pixels.min(axis=1),
        "max": pixels.max(axis=1),
        "mean": pixels.mean(axis=1),
        "std": pixels.std(axis=1),
        "count": np.array([len(sample)]),
    }
    for name, q in QUANTILES.items():
        out[name] = np.quantile(pixels, q, axis=1)
    return out


def _frames(kind: str, shape: tuple[int, ...], seed: int) -> npt.NDArray[np.uint8]:
    rng = np.random.default_rng(seed)
    if kind == "noise":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if kind == "few levels":  # quantiles that fall between two levels, and on them
        return rng.integers(100, 103, shape, dtype=np.uint8)
    if kind == "extremes":
        return rng.choice(np.array([0, 255], dtype=np.uint8), shape)
    return np.full(shape, 77, dtype=np.uint8)  # constant


@pytest.mark.parametrize("kind", ["noise", "few levels", "extremes", "constant"])
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 1, 3), (1, 1, 1, 1), (7, 5, 3, 3), (40, 72, 96, 3), (150, 12, 331, 3), (3, 480, 640, 1)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_image_stats_equal_the_float_reduction(kind: str, shape: tuple[int, ...]) -> None:
    frames = _frames(kind, shape, seed=sum(shape))
    got, want = image_stats(frames), _reference(frames)
    channels = shape[-1]
    assert set(got) == set(want)
    assert got["count"].tolist() == want["count"].tolist()
    for key in ("min", "max", "mean", "std", *QUANTILES):
        assert got[key].shape == (channels, 1, 1), key
        if key in ("mean", "std"):  # sums in another order: equal to rounding
            np.testing.assert_allclose(got[key].ravel(), want[key], rtol=0, atol=1e-12, err_msg=key)
        else:  # a level, or np.quantile's interpolation between two: bit for bit
            assert got[key].ravel().tolist() == want[key].tolist(), key
