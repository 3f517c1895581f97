"""The line a training run with ``[datagen]`` says when its data generation ends: counts in
words (it printed a Python dict) that add up to the items with what earlier runs did (it left
out the ones the journal recorded), and an earlier, complete run said as such (its counts all
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
    kept = sum(1 for o in outcomes.values() if o == "kept")
    return PipelineResult(metrics, outcomes, {}, kept=kept, already_complete=complete)


@pytest.mark.parametrize(
    ("result", "before", "said"),
    [
        (
            _result({"a": "ok", "b": "ok", "c": "kept"}),
            3,
            "data generation done: 2 ok, 0 pruned, 0 dead; 4 done by earlier runs (3 recorded, "
            "1 found committed)",
        ),
        (_result({"a": "ok"}), 0, "data generation done: 1 ok, 0 pruned, 0 dead"),
        (_result({}, complete=True), 0, "data generation: already complete in /out/data (an earlier run)"),
    ],
)
async def test_the_datagen_line_says_what_ran(
    monkeypatch: pytest.MonkeyPatch, result: PipelineResult, before: int, said: str
) -> None:
    async def fake_run(*_: Any, on_start: Any = None, **__: Any) -> PipelineResult:
        if on_start is not None and not result.already_complete:
            on_start(SimpleNamespace(before=before))
        return result

    monkeypatch.setattr(runner, "run_pipeline", fake_run)
    lines: list[str] = []
    await run_datagen(CFG, "tcp://127.0.0.1:1", False, lines.append)
    assert lines == [said]
