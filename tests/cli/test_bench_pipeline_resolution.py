"""``troupe bench pipeline --resolution WxH`` (issue 14, "realistic frames"): the baseline
against the pipeline at a given image size, with the bytes and frames/s a reader compares.

These check the figures and the processes, not the machine's speed: no rate is bounded."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from support.bench_cli import run_bench
from support.bench_pipeline_figures import check_cpu_bounds, check_whole_run
from troupe.cli.bench.pipeline_resolution import (
    default_scenes,
    parse_resolution,
    resolution_lines,
    resolution_pipeline,
)
from troupe.cli.main import app


def _bench(*args: str, timeout_s: float = 300) -> tuple[int, str, str]:
    return run_bench("pipeline", *args, timeout=timeout_s)


def test_quick_resolution_run_reports_every_key() -> None:
    code, stdout, stderr = _bench("--resolution", "64x48", "--scenes", "2", "--json")
    assert code == 0, stderr
    fig = json.loads(stdout)
    assert fig["resolution"] == "64x48"
    for key in (
        "speedup_wall",
        "frames_per_item",
        "render_fps_cpu",
        "render_fps_cpu_one_thread",
        "item_bytes",
        "baseline_s",
        "pipeline_wall_s",
    ):
        assert math.isfinite(fig[key]) and fig[key] > 0, (key, fig[key])
    check_whole_run(fig)
    check_cpu_bounds(fig)
    # The human lines (the same figures, without --json) show the bounds beside speedup_wall.
    text = "\n".join(resolution_lines(fig))
    assert f"speedup_wall_bound {fig['speedup_wall_bound']:.2f}x" in text
    assert f"speedup_cpu_bound {fig['speedup_cpu_bound']:.2f}x" in text
    assert f"({fig['pipeline_cores_used']:.2f} of {fig['cores']} cores busy" in text
    # One item's frames: uint8 RGB and float32 depth at 64x48, for the frames it holds.
    assert fig["item_bytes"] == round(fig["frames_per_item"] * 64 * 48 * 7)
    assert fig["pipeline_ok"] == fig["baseline_ok"] > 0
    ebpi = fig["engine_bytes_per_item"]
    assert ebpi is None or (math.isfinite(ebpi) and ebpi > 0)
    if fig["render_fps_gpu"] is None:
        assert "cuda" in fig["render_fps_gpu_note"].lower()
    else:
        assert fig["render_fps_gpu"] > 0


@pytest.mark.parametrize("bad", ["640x", "0x480", "abc", "640x480x3", "-640x480", "640x5000"])
def test_malformed_resolution_exits_2_naming_option_and_value(bad: str) -> None:
    result = CliRunner().invoke(app, ["bench", "pipeline", "--resolution", bad, "--json"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "--resolution" in lines[0] and repr(bad) in lines[0]


def test_parse_resolution_accepts_width_by_height() -> None:
    assert parse_resolution("640x480") == (640, 480)
    assert parse_resolution(" 64X48 ") == (64, 48)


def test_default_scenes_shrink_with_the_frame_size() -> None:
    assert default_scenes(1920, 1080) <= default_scenes(640, 480) <= default_scenes(320, 240)
    assert default_scenes(1920, 1080) >= 2 and default_scenes(64, 48) <= 64


def test_resolution_pipeline_renders_at_the_size_on_every_core() -> None:
    cfg = resolution_pipeline(640, 480, 3)
    stages = {s.name: s for s in cfg.stages}
    assert cfg.items == 3
    assert (stages["load"].kwargs["width"], stages["load"].kwargs["height"]) == (640, 480)
    # The scheduler may run every replica the stages ask for.
    assert cfg.slots is not None and cfg.slots >= sum(s.max_replicas or s.replicas for s in cfg.stages)
