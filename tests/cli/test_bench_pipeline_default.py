"""``troupe bench pipeline`` in its default mode (issue 14): the same whole-run figures as
``--resolution`` (``speedup_wall``, ``startup_share``, the CPU time bounds), the baseline timed
whole (writer drained, dataset written) as the pipeline is.

These check the figures and the processes, not the machine's speed: no rate is bounded."""

from __future__ import annotations

import math
from typing import Any

import pytest

from support.bench_cli import bench_json, run_bench
from support.bench_pipeline_figures import CPU_DEFINITIONS, check_cpu_bounds, check_whole_run
from troupe.cli.bench.pipeline import pipeline_lines

SMALL_RUN = ("pipeline", "--scenes", "4", "--synthetic", "20", "--cpu", "20")


@pytest.fixture(scope="module")
def fig() -> dict[str, Any]:
    return bench_json(*SMALL_RUN, timeout=600)


def test_default_run_reports_every_whole_run_key(fig: dict[str, Any]) -> None:
    measured = CPU_DEFINITIONS - {"pipeline_children_left"}  # a count, 0 below
    for key in (
        "baseline_s",
        "baseline_loop_s",
        "baseline_items_per_s",
        "pipeline_s",
        "pipeline_wall_s",
        "speedup",
        "speedup_wall",
        *sorted(measured),
        "startup_share",
        "startup_s",
        "steady_s",
        "finalize_s",
        "lambda",
        "lambda_theory",
        "synthetic_vs_configured",
        "synthetic_cpu_vs_bound",
    ):
        assert math.isfinite(fig[key]) and fig[key] > 0, (key, fig[key])
    assert fig["pipeline_children_left"] == 0
    assert fig["pipeline_ok"] == fig["baseline_ok"] > 0


def test_speedup_wall_compares_the_whole_baseline_with_the_whole_run(fig: dict[str, Any]) -> None:
    check_whole_run(fig)
    # The whole baseline includes its loop, then the writer's draining and the dataset's write.
    assert fig["baseline_loop_s"] <= fig["baseline_s"]
    assert fig["baseline_items_per_s"] == pytest.approx(fig["baseline_ok"] / fig["baseline_s"])
    # Steady against steady: the baseline's loop against the pipeline from its first item in.
    assert fig["speedup"] == pytest.approx(fig["baseline_loop_s"] / fig["pipeline_s"])


def test_cpu_bounds_are_those_of_the_resolution_mode(fig: dict[str, Any]) -> None:
    check_cpu_bounds(fig)


def test_human_lines_show_the_whole_run_beside_its_bounds(fig: dict[str, Any]) -> None:
    text = "\n".join(pipeline_lines(fig))
    assert f"{fig['baseline_loop_s']:.2f} s until the last item was handed to the writer" in text
    assert f"start-up share {fig['startup_share']:.0%}" in text
    assert f"speedup_wall {fig['speedup_wall']:.2f}x" in text
    assert f"speedup_wall_bound {fig['speedup_wall_bound']:.2f}x" in text
    assert f"speedup_cpu_bound {fig['speedup_cpu_bound']:.2f}x" in text
    assert f"({fig['pipeline_cores_used']:.2f} of {fig['cores']} cores busy" in text
    assert f"speedup {fig['speedup']:.2f}x (baseline_loop_s / pipeline_s)" in text


def test_human_output_prints_every_line() -> None:
    code, stdout, stderr = run_bench(*SMALL_RUN, timeout=600)
    assert code == 0, stderr
    lines = stdout.splitlines()
    for start in (
        "sequential baseline:",
        "troupe pipeline:",
        "speedup_wall ",
        "CPU time: baseline",
        "steady: pipeline",
        "synthetic: lambda",
        "CPU-bound synthetic:",
    ):
        assert sum(line.startswith(start) for line in lines) == 1, (start, stdout)
