"""``troupe run PIPELINE.toml --items N --out DIR --json``: the run's metrics as one JSON
object on stdout, for scripts; and ``--items`` refused when it is not a count of items.

The pipeline is the synthetic CostStage one at a millisecond per item, so a run is quick.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.synthetic_runs import synthetic_pipeline, troupe_run

pytestmark = pytest.mark.e2e

STAGE_KEYS = {"l_s", "N_s", "mu_s", "busy", "actor_s_per_item", "engine_s_per_item"}


def _troupe_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    pipeline = synthetic_pipeline(tmp_path, plan="cost_s = 0.001, prune_every = 4")
    return troupe_run(pipeline, tmp_path / "out", *args)


def test_json_prints_one_object_with_the_metrics(tmp_path: Path) -> None:
    """--json: exit 0, stdout is exactly one JSON object with the throughput figures, the items'
    counts, and per stage the model's figures with the in-actor time next to the engine's; run
    again, the object says the run was complete already."""
    proc = _troupe_run(tmp_path, "--items", "6", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # the whole of stdout: one object, nothing around it
    assert isinstance(report, dict)
    assert {"lambda", "lambda_theory", "lambda_succ", "efficiency", "items", "stages"} <= set(report)
    assert report["items"] == {"ok": 4, "pruned": 2, "dead": 0, "kept": 0}  # seeds 0 and 4 pruned
    assert report["remade"] == 0 and report["restarted"] == 0
    assert report["lambda"] > 0 and report["lambda_theory"] > 0
    assert report["lambda_succ"] == pytest.approx(report["lambda"] * 4 / 6)
    assert set(report["stages"]) == {"plan", "store"}
    for name, stage in report["stages"].items():
        assert set(stage) >= STAGE_KEYS, (name, stage)
        assert all(isinstance(stage[k], (int, float)) for k in STAGE_KEYS), (name, stage)
        assert 0 < stage["actor_s_per_item"] <= stage["engine_s_per_item"], (name, stage)
        assert stage["engine_s_per_item"] == stage["l_s"]

    again = _troupe_run(tmp_path, "--items", "6", "--json")  # the same run into the same --out
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert json.loads(again.stdout)["already_complete"] is True


@pytest.mark.parametrize("count", ["0", "-3"])
def test_items_not_a_positive_count_is_a_one_line_error(tmp_path: Path, count: str) -> None:
    """--items 0 (or less): exit 2, one line naming --items and the value; nothing written."""
    proc = _troupe_run(tmp_path, "--items", count)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "--items" in lines[0] and count in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_items_and_scenes_that_disagree_are_refused(tmp_path: Path) -> None:
    """--items 3 --scenes 4: exit 2, one line naming both; nothing runs."""
    proc = _troupe_run(tmp_path, "--items", "3", "--scenes", "4")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "--items 3" in lines[0] and "--scenes 4" in lines[0], lines
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--items", "--scenes"])
def test_a_training_config_s_item_count_errors_name_the_flag_given(tmp_path: Path, flag: str) -> None:
    """A training config without [datagen] refuses a count under the name it was given (--scenes
    was refused as --items), and a training run refuses --items and --scenes that disagree."""
    config = Path(__file__).resolve().parents[2] / "configs" / "train.toml"
    command = [sys.executable, "-m", "troupe.cli.main", "run", str(config), "--out", str(tmp_path / "out")]
    env = {**os.environ, "COLUMNS": "200"}
    refused = subprocess.run([*command, flag, "3"], capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{flag} 3: " in refused.stderr and f"{flag} sets its items" in refused.stderr, refused.stderr
    both = subprocess.run(
        [*command, "--items", "3", "--scenes", "4"], capture_output=True, text=True, timeout=120, env=env
    )
    assert both.returncode == 2 and "--items 3 and --scenes 4 disagree" in both.stderr, both.stderr
    assert not (tmp_path / "out").exists()
