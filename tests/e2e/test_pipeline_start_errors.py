"""A stage whose class the workers cannot import fails the run at once, saying why, on a
running node as on the local one; the node does not keep restarting the broken replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe import ConfigError, PipelineConfig, StageFailed, run_pipeline
from troupe.runtime.testing.cluster import Cluster

BROKEN = PipelineConfig.model_validate(
    {
        "name": "broken",
        "items": 2,
        "stages": [
            {"name": "ok", "actor": "troupe.actors.bench.synthetic:CostStage", "kwargs": {"cost_s": 0.0}},
            {"name": "missing", "actor": "no_such_module_here:Stage"},
        ],
    }
)


@pytest.mark.timeout(120)
async def test_a_stage_that_does_not_import_on_a_running_node_fails_at_once(
    troupe_cluster: object, tmp_path: Path
) -> None:
    cluster: Cluster = troupe_cluster("")  # type: ignore[operator]
    with pytest.raises(StageFailed) as err:
        await cluster.run_pipeline(BROKEN)
    said = str(err.value)
    assert "stage missing" in said and "No module named 'no_such_module_here'" in said, said
    status = await cluster.status()
    broken = [w for w in status["workers"] if w["name"].startswith("broken-missing-")]
    assert broken and all(w["state"] == "stopped" and w["restarts"] == 0 for w in broken), broken
    assert not [w for w in status["workers"] if w["state"] in ("running", "starting")], status["workers"]


@pytest.mark.timeout(120)
async def test_a_stage_that_does_not_import_is_refused_before_a_local_run_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        await run_pipeline(BROKEN, tmp_path / "out")
    assert "stages.missing.actor" in str(err.value)
    assert not (tmp_path / "out").exists(), "nothing is made before the check"
