"""``troupe run`` splits its wall time into start-up, steady state and finalisation, and says
what share of it was not spent running items (``startup_share``, issue 14's target).

The pipeline is the synthetic CostStage one at a millisecond per item, so a run is quick; the
checks are on the split's arithmetic and order, never on how fast anything is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.json_doc import undocumented
from support.synthetic_runs import synthetic_pipeline, troupe_run
from troupe.runtime.pipeline.runner import run_pipeline_sync
from troupe.runtime.testing.plugin import free_endpoint

pytestmark = pytest.mark.e2e

SPLIT = ("startup_s", "steady_s", "finalize_s")


def _split(tmp_path: Path) -> Path:
    return synthetic_pipeline(tmp_path, "split", items=6)


def test_json_has_the_wall_time_split_and_the_startup_share(tmp_path: Path) -> None:
    proc = troupe_run(_split(tmp_path), tmp_path / "out", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["items"]["ok"] == 6
    assert all(report[key] >= 0 for key in SPLIT)
    assert report["startup_s"] > 0 and report["finalize_s"] > 0  # a cluster starts and stops
    total = sum(report[key] for key in SPLIT)
    assert total == pytest.approx(report["wall_s"], abs=1e-6)
    share = (report["startup_s"] + report["finalize_s"]) / report["wall_s"]
    assert report["startup_share"] == pytest.approx(share)
    assert 0 < report["startup_share"] <= 1
    assert undocumented("troupe run --json", report) == []  # au 5: docs/METRICS.md names each key


def test_the_table_says_the_startup_share(tmp_path: Path) -> None:
    proc = troupe_run(_split(tmp_path), tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "start-up share" in proc.stdout


def test_the_api_result_has_the_split(tmp_path: Path) -> None:
    """Start-up ends once every stage serves, before the items' time; the three parts make the wall time."""
    toml = _split(tmp_path)
    result = run_pipeline_sync(
        toml, tmp_path / "out", node_endpoint=free_endpoint(), master_endpoint=free_endpoint()
    )
    assert result.counts()["ok"] == 6
    assert result.startup_s + result.steady_s + result.finalize_s == pytest.approx(result.wall_s, abs=1e-6)
    assert result.startup_s > 0 and result.steady_s >= 0 and result.finalize_s > 0
    assert result.metrics.elapsed_s <= result.steady_s + result.finalize_s + 1e-6
