"""A program's callback (here ``on_progress``) that raises stops the run, and
``run_pipeline`` raises that very exception, not an ExceptionGroup holding one holding it (report
ap 3); the replicas are stopped (the suite's conftest fails a test that leaves a process), and
what the run ended stays ended: the same run again resumes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.result import PipelineMetrics
from troupe.runtime.pipeline.runner import RunStart, run_pipeline
from troupe.runtime.testing.plugin import import_path

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 90  # a bound on a hang, never on speed
ITEMS = 6


class CallbackBug(ValueError):
    pass


@pytest.fixture(autouse=True)
def workers_import_the_test_stages(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PYTHONPATH", import_path())
    yield


def _pipeline(log: Path) -> PipelineConfig:
    stage = {"name": "a", "actor": "support.hook_stages:RecordingStage", "kwargs": {"log": str(log)}}
    return PipelineConfig.model_validate({"name": "cb", "items": ITEMS, "stages": [stage]})


async def test_on_progress_that_raises_stops_the_run_and_is_raised_as_itself(tmp_path: Path) -> None:
    bug = CallbackBug("user callback bug")

    def on_progress(metrics: PipelineMetrics) -> None:
        if metrics.items_done >= 1:  # once an item has ended: the rerun must keep it
            raise bug

    cfg, out = _pipeline(tmp_path / "records.jsonl"), tmp_path / "out"
    with anyio.fail_after(RUN_TIMEOUT_S), pytest.raises(CallbackBug) as raised:
        await run_pipeline(cfg, out, on_progress=on_progress)
    assert raised.value is bug

    started: list[RunStart] = []
    with anyio.fail_after(RUN_TIMEOUT_S):
        again = await run_pipeline(cfg, out, on_start=started.append)
    assert started[0].before >= 1
    assert again.counts()["ok"] == ITEMS - started[0].before
