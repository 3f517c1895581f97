"""``troupe run configs/datagen-train.toml``: the data generation pipeline and training on one
cluster, the ranks starting once ``min_episodes`` are committed; the report has both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.json_doc import undocumented
from support.train_run_cli import config_copy, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_generation_and_training_together(tmp_path: Path) -> None:
    changes = {"train": {"steps": 4, "min_episodes": 2}}
    config = config_copy(tmp_path / "datagen-train.toml", "datagen-train.toml", changes)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), "--items", "4", "--json")
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    report = json.loads(stdout)
    assert report["steps"] == 4 and len(report["losses"]) == 4
    assert report["datagen"]["items"]["ok"] >= 2, report["datagen"]
    assert undocumented("troupe run --json", report, of="a training config") == []  # lc 5: docs/METRICS.md
    assert (out / "data" / "meta" / "info.json").is_file()  # the pipeline finalised its dataset
    assert [Path(c).name for c in report["checkpoints"]][-1] == "step-000000004"

    # The same command again: complete, both halves, and nothing starts (it started a cluster
    # and said "trained 4 steps: loss -, 0.00 samples/s").
    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), "--items", "4", "--json")
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    again = json.loads(stdout)
    assert again["already_complete"] is True and again["step"] == 4, again
    assert undocumented("troupe run --json", again, of="a training config") == []


def test_fewer_items_than_the_episodes_training_waits_for_is_refused_before_start(tmp_path: Path) -> None:
    """It generated all its items, then said the ranks never got their min_episodes."""
    changes = {"train": {"steps": 4, "min_episodes": 50}}
    config = config_copy(tmp_path / "datagen-train.toml", "datagen-train.toml", changes)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), "--items", "6", timeout=300)
    assert code == 2, stdout[-3000:] + stderr[-3000:]
    assert "[datagen] makes 6 episode(s) at most (its items), fewer than train.min_episodes = 50" in stderr
    assert not (out / "data").exists()
