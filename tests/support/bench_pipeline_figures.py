"""Checks shared by the tests of both modes of ``troupe bench pipeline``: the whole-run figures
and the CPU time bounds each mode reports the same way (``troupe.cli.bench.baseline``)."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

__all__ = ["CPU_DEFINITIONS", "check_cpu_bounds", "check_whole_run"]

CPU_DEFINITIONS = {
    "cores",
    "baseline_cpu_s",
    "pipeline_cpu_s",
    "pipeline_children_left",
    "baseline_cores_used",
    "pipeline_cores_used",
    "speedup_wall_bound",
    "speedup_cpu_bound",
}
"""The figures the JSON defines under ``definitions``."""


def check_cpu_bounds(fig: dict[str, Any]) -> None:
    """The CPU time figures are measured, consistent with their definitions, and complete."""
    for key in (
        "baseline_cpu_s",
        "pipeline_cpu_s",
        "baseline_cores_used",
        "pipeline_cores_used",
        "speedup_wall_bound",
        "speedup_cpu_bound",
    ):
        value = fig[key]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    cores = fig["cores"]
    assert isinstance(cores, int) and 1 <= cores <= (os.cpu_count() or 1)
    b_s, b_cpu, p_s, p_cpu = (
        float(fig[k]) for k in ("baseline_s", "baseline_cpu_s", "pipeline_wall_s", "pipeline_cpu_s")
    )
    assert fig["baseline_cores_used"] == pytest.approx(b_cpu / b_s)
    assert fig["pipeline_cores_used"] == pytest.approx(p_cpu / p_s)
    assert fig["speedup_wall_bound"] == pytest.approx(b_s / (b_cpu / cores))
    assert fig["speedup_cpu_bound"] == pytest.approx(b_s / (p_cpu / cores))
    # No process can keep more cores busy than there are (slack: the clocks' granularity).
    assert float(fig["baseline_cores_used"]) <= cores + 0.1
    assert float(fig["pipeline_cores_used"]) <= cores + 0.1
    # Every process the run started was reaped within it, so its CPU time is in the count.
    assert fig["pipeline_children_left"] == 0
    # The JSON says what each figure is.
    assert set(fig["definitions"]) == CPU_DEFINITIONS


def check_whole_run(fig: dict[str, Any]) -> None:
    """``speedup_wall`` is the whole baseline over the whole run, and ``startup_share`` the share
    of the run's parts not spent moving items."""
    for key in ("baseline_s", "pipeline_wall_s", "speedup_wall", "startup_s", "steady_s", "finalize_s"):
        assert math.isfinite(fig[key]) and fig[key] > 0, (key, fig[key])
    assert fig["speedup_wall"] == pytest.approx(fig["baseline_s"] / fig["pipeline_wall_s"])
    assert 0 < fig["startup_share"] < 1
    parts = fig["startup_s"] + fig["steady_s"] + fig["finalize_s"]
    assert abs(fig["startup_share"] - (fig["startup_s"] + fig["finalize_s"]) / parts) <= 1e-6
