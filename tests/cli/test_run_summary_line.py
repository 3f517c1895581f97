"""The closing line of a resumed `troupe run` adds up to the pipeline's items."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from troupe.cli.commands import run_pipeline as command
from troupe.runtime.pipeline.result import PipelineMetrics, PipelineResult


def _result(ok: int, kept: int) -> PipelineResult:
    metrics = PipelineMetrics((), 7.0, ok, ok, 0, 0, 5.0, 5.0, 5.5, "render")
    outcomes = {f"i{n}": "ok" for n in range(ok)} | {f"k{n}": "kept" for n in range(kept)}
    return PipelineResult(metrics, outcomes, {}, kept=kept, wall_s=10.0, startup_s=2.0, steady_s=7.0)


def _printed(capsys: pytest.CaptureFixture[str], result: PipelineResult, before: int) -> str:
    command._report(result, before, Path("out"))
    return " ".join(capsys.readouterr().out.split())


def test_a_resumed_run_counts_what_earlier_runs_recorded_and_committed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = _printed(capsys, _result(ok=36, kept=2), before=26)
    assert "36 ok, 0 pruned, 0 dead" in line
    found = re.search(r"(\d+) done by earlier runs \((\d+) recorded, (\d+) found committed\)", line)
    assert found, line
    earlier, recorded, committed = map(int, found.groups())
    assert (earlier, recorded, committed) == (28, 26, 2)
    assert 36 + earlier == 64


def test_a_first_run_says_nothing_of_earlier_runs(capsys: pytest.CaptureFixture[str]) -> None:
    line = _printed(capsys, _result(ok=64, kept=0), before=0)
    assert "64 ok" in line and "earlier" not in line


def test_a_rerun_whose_record_had_everything_committed_omits_the_found_part(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = _printed(capsys, _result(ok=10, kept=0), before=54)
    assert "54 done by earlier runs (54 recorded)" in line and "found committed" not in line


def test_the_summary_lines_are_whole_lines_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    """Piped (here: captured, at rich's 80 columns), each line is one line: a script that
    greps the run's figures or the dataset's path gets them whole, not split at column 80."""
    command._report(_result(ok=36, kept=2), 26, Path("out"))
    lines = capsys.readouterr().out.splitlines()
    summary = [line for line in lines if line.startswith("lambda ")]
    assert len(summary) == 1 and "done by earlier runs" in summary[0], lines
    assert any(line.startswith("wall ") and "start-up share" in line for line in lines), lines
