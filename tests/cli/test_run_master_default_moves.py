"""`troupe run --endpoint X` leaves its master on the default port, found free before the run
imports for a second or two: the run may move that master if the port is taken meanwhile (two
runs at once; two tests under -n 2 failed so). It could not: only a run given neither endpoint
could move. The command now says the master's default may move, and the given endpoint not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from troupe.cli import preflight
from troupe.cli.commands import run_pipeline
from troupe.cli.main import app


def _finish_run_kwargs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> dict[str, Any]:
    """What ``troupe run ARGS`` hands to the run (its checks and the run itself stand-ins)."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(preflight, "check_run", lambda *_: None)
    monkeypatch.setattr(run_pipeline, "finish_run", lambda *a, **kw: seen.update(kw))
    result = CliRunner().invoke(app, ["run", "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 0, result.output
    return seen


def test_with_endpoint_given_the_master_s_default_may_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _finish_run_kwargs(tmp_path, monkeypatch, "--endpoint", "tcp://127.0.0.1:49891")
    assert (seen["defaults"], seen["master_default"]) == (False, True)


def test_with_master_given_nothing_moves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _finish_run_kwargs(tmp_path, monkeypatch, "--master", "tcp://127.0.0.1:49892")
    assert (seen["defaults"], seen["master_default"]) == (False, False)
