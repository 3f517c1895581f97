"""What a finished ``troupe run`` shows of items that died: its bars reach the items ended (a
run whose 3 of 6 items died ended with its bar at 3/6, as if it had stopped halfway), and the
table's column of failed attempts says what it counts (it was "retry": 3, for a stage of
``max_attempts = 1`` where nothing can be retried). And its start line counts in words that
agree with the number ("running 6 items through 1 stages").

The command is run in this process; the run itself is a stand-in that reports what a stage
raising on every other item reports."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from troupe.cli.commands import run_pipeline as command
from troupe.runtime.pipeline.result import PipelineMetrics, PipelineResult, StageMetrics
from troupe.runtime.pipeline.runner import RunStart

_BAR = re.compile(r" (\d+/\d+) q \d+/\d+ x\d+ ")  # a bar's count, then its note


def _bars(lines: list[str]) -> dict[str, str]:
    """Each bar's count by its stage."""
    return {line.split()[0]: found.group(1) for line in lines if (found := _BAR.search(line))}


def _stage(name: str, items_in: int, out: int, pruned: int, errors: int) -> StageMetrics:
    return StageMetrics(name, items_in, out, pruned, errors, 0.01, 1.0, 100.0, 0, 0, 4, 0.5, 1)


def _run(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    items: int,
    stages: tuple[StageMetrics, ...],
    outcomes: dict[str, str],
) -> None:
    """``troupe run`` of ``items`` through ``stages``, which end as ``outcomes`` say."""
    counts = {o: sum(1 for v in outcomes.values() if v == o) for o in ("ok", "pruned", "dead")}
    metrics = PipelineMetrics(
        stages, 1.0, len(outcomes), counts["ok"], counts["pruned"], counts["dead"], 6.0, 3.0, 100.0, "s"
    )

    async def run_pipeline(_cfg: Any, out: Path, *, on_start: Any, on_progress: Any, **_: Any) -> Any:
        on_start(RunStart(1.0, items, 0, len(stages), out, node_endpoint="tcp://127.0.0.1:7479"))
        on_progress(metrics)
        errors = {task: "OSError: boom" for task, outcome in outcomes.items() if outcome == "dead"}
        return PipelineResult(metrics, outcomes, errors, wall_s=2.0, startup_s=1.0, steady_s=1.0)

    declared = SimpleNamespace(items=items, stages=[SimpleNamespace(name=s.name) for s in stages])
    monkeypatch.setattr(command, "declared_config", lambda *_: declared)
    monkeypatch.setattr(command, "RunDir", lambda _out: SimpleNamespace(check=lambda *_: None))
    monkeypatch.setattr(command, "fingerprint", lambda _cfg: "")
    monkeypatch.setattr(command, "run_pipeline", run_pipeline)
    command.finish_run(None, tmp_path / "out", None, "tcp://127.0.0.1:7479", "tcp://127.0.0.1:7478")


def test_a_finished_run_whose_items_died_fills_its_bar_and_counts_failed_attempts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcomes = {f"i{n}": "dead" if n % 2 == 0 else "ok" for n in range(6)}
    _run(monkeypatch, tmp_path, 6, (_stage("boom", 6, 3, 0, 3),), outcomes)
    lines = capsys.readouterr().out.splitlines()
    assert _bars(lines) == {"boom": "6/6"}, lines
    (header,) = [line for line in lines if line.strip().startswith("stage ")]
    assert header.split()[:5] == ["stage", "in", "out", "pruned", "errors"], header
    assert any(
        line.startswith("node up in ") and "running 6 items through 1 stage into" in line for line in lines
    )


def test_every_stage_s_bar_reaches_the_items_ended_upstream_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An item pruned by the first stage never reaches the second: once the run ended, the
    second's bar is full all the same (no item is left for it)."""
    outcomes = {"a": "pruned", "b": "ok", "c": "dead"}
    _run(monkeypatch, tmp_path, 3, (_stage("first", 3, 2, 1, 0), _stage("second", 2, 1, 0, 1)), outcomes)
    lines = capsys.readouterr().out.splitlines()
    assert any("running 3 items through 2 stages into" in line for line in lines), lines
    assert _bars(lines) == {"first": "3/3", "second": "3/3"}, lines


def test_one_item_through_one_stage_is_said_in_the_singular(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(monkeypatch, tmp_path, 1, (_stage("only", 1, 1, 0, 0),), {"a": "ok"})
    assert "running 1 item through 1 stage into" in capsys.readouterr().out
