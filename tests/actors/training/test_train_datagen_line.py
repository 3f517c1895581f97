"""The line a training run with ``[datagen]`` says when its data generation ends: counts in
words (it printed a Python dict), and an earlier, complete run said as such (its counts all
read 0)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from troupe.actors.training.train_datagen import run_datagen
from troupe.runtime.pipeline import runner
from troupe.runtime.pipeline.result import PipelineMetrics, PipelineResult

pytestmark = pytest.mark.anyio

CFG = SimpleNamespace(
    datagen=SimpleNamespace(pipeline="p.toml", items=6), train=SimpleNamespace(dataset="/out/data")
)


def _result(outcomes: dict[str, str], complete: bool = False) -> PipelineResult:
    metrics = PipelineMetrics((), 1.0, 6, 6, 0, 0, 5.0, 5.0, 5.5, "render")
    return PipelineResult(metrics, outcomes, {}, already_complete=complete)


@pytest.mark.parametrize(
    ("result", "said"),
    [
        (
            _result({"a": "ok", "b": "ok", "c": "kept"}),
            "data generation done: 2 ok, 0 pruned, 0 dead, 1 kept from an earlier run",
        ),
        (_result({}, complete=True), "data generation: already complete in /out/data (an earlier run)"),
    ],
)
async def test_the_datagen_line_says_what_ran(
    monkeypatch: pytest.MonkeyPatch, result: PipelineResult, said: str
) -> None:
    async def fake_run(*_: Any, **__: Any) -> PipelineResult:
        return result

    monkeypatch.setattr(runner, "run_pipeline", fake_run)
    lines: list[str] = []
    await run_datagen(CFG, "tcp://127.0.0.1:1", False, lines.append)
    assert lines == [said]
