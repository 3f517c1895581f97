"""`troupe run` names what killed its dead items: each error once, with the items it killed,
printed as text (an error is the user's code's, and may hold rich markup), and every item's
error under `--json`'s ``errors``."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.cli.commands import run_pipeline as command
from troupe.runtime.pipeline.result import PipelineMetrics, PipelineResult


def _result(dead: dict[str, str], ok: int = 5, pruned: dict[str, str] | None = None) -> PipelineResult:
    pruned = pruned or {}
    metrics = PipelineMetrics((), 7.0, ok, ok, len(pruned), len(dead), 5.0, 5.0, 5.5, "smooth")
    outcomes = {f"ok{n}": "ok" for n in range(ok)}
    outcomes |= dict.fromkeys(dead, "dead") | dict.fromkeys(pruned, "pruned")
    return PipelineResult(metrics, outcomes, {**dead, **pruned}, wall_s=10.0, startup_s=2.0, steady_s=7.0)


def test_each_error_is_named_once_with_the_items_it_killed() -> None:
    boom = "KeyError: 'boom'"
    dead = {f"s-{n:02d}": boom for n in range(5)} | {"s-90": "ValueError: bad scene"}
    lines = command.dead_lines(_result(dead), Path("out/logs/local.jsonl"))
    assert lines[0] == f"dead 5: {boom} (s-00, s-01, s-02 and 2 more)"  # the most frequent first
    assert lines[1] == "dead 1: ValueError: bad scene (s-90)"
    assert "--json" in lines[-1] and "out/logs/local.jsonl" in lines[-1]


def test_past_three_errors_the_rest_are_counted() -> None:
    dead = {f"s-{n}": f"Error{n}: different" for n in range(5)}
    lines = command.dead_lines(_result(dead), Path("log"))
    assert sum(line.startswith("dead 1: ") for line in lines) == 3
    assert "dead: 2 other errors" in lines
    one_more = {f"s-{n}": f"Error{n}: different" for n in range(4)}
    assert "dead: 1 other error" in command.dead_lines(_result(one_more), Path("log"))


def test_pruned_items_and_a_run_with_no_dead_print_nothing() -> None:
    assert command.dead_lines(_result({}, pruned={"s-1": "ItemFailed: flat"}), Path("log")) == []


def test_markup_in_an_error_is_printed_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    error = "KeyError: '[bold red]boom[/]'"
    result = _result({"s-7": error})
    command._report(result, 0, Path("out"))
    printed = " ".join(capsys.readouterr().out.split())
    assert f"dead 1: {error} (s-7)" in printed, printed
    assert command.metrics_json(result)["errors"] == {"s-7": error}


def test_a_terminal_escape_in_an_error_is_written_out(capsys: pytest.CaptureFixture[str]) -> None:
    """An error's text reaches the terminal: its escape codes (a colour, a cursor move, a title)
    are shown as ``\\x1b``, never acted on."""
    error = "ValueError: \x1b[2J\x1b]0;pwned\x07gone"
    command._report(_result({"s-7": error}), 0, Path("out"))
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "\x07" not in printed
    assert "dead 1: ValueError: \\x1b[2J\\x1b]0;pwned\\x07gone (s-7)" in " ".join(printed.split())
