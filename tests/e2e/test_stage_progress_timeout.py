"""A stage's ``progress_timeout_s`` reaches the run's own node: a replica that works on one item
longer than that without reporting progress is killed as hung and the item retried (then dead),
and 0 turns the check off. A stage whose items took over the node's 30 s had no knob: its items
were killed and dead-lettered as "Unreachable"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from troupe.runtime.node.config import SupervisionConfig
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.run_cluster import stage_supervision
from troupe.runtime.pipeline.runner import run_pipeline
from troupe.runtime.testing.plugin import import_path

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def replicas_import_the_test_stages(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PYTHONPATH", import_path())
    yield


def _pipeline(log: Path, progress_timeout_s: float) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "slow",
            "items": 1,
            "max_attempts": 1,
            "stages": [
                {
                    "name": "think",
                    "actor": "support.hook_stages:RecordingStage",
                    "progress_timeout_s": progress_timeout_s,
                    "kwargs": {"log": str(log), "cost_s": 4.0},  # one sleep: no progress meanwhile
                }
            ],
        }
    )


def test_the_stage_setting_becomes_its_replicas_kind_policy(tmp_path: Path) -> None:
    supervision = stage_supervision(_pipeline(tmp_path / "log", 0.5))
    assert supervision.policy_for("think").progress_timeout_s == 0.5
    assert supervision.policy_for("other").progress_timeout_s == SupervisionConfig().progress_timeout_s
    assert stage_supervision(_pipeline(tmp_path / "log", 0)).policy_for("think").progress_timeout_s is None


@pytest.mark.parametrize(("timeout_s", "outcome"), [(0.5, "dead"), (0.0, "ok")])
def test_a_replica_past_its_stage_progress_timeout_is_killed_and_0_turns_it_off(
    tmp_path: Path, timeout_s: float, outcome: str
) -> None:
    async def run() -> dict[str, str]:
        with anyio.fail_after(RUN_TIMEOUT_S):
            result = await run_pipeline(_pipeline(tmp_path / "log", timeout_s), tmp_path / "out")
        if outcome == "dead":
            assert result.errors, (result.outcomes, result.restarted, result.metrics)
            assert "no_progress" in next(iter(result.errors.values())), result.errors
        return result.outcomes

    outcomes = anyio.run(run)
    assert list(outcomes.values()) == [outcome]
