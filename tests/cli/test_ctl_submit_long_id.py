"""`troupe ctl submit` refuses a job id whose task ids would be too long, in one line, before
the master is asked: an id of 194-200 characters was accepted ("submitted job ...: 2 tasks"),
and every generated task (``ID-000000``, 202 characters) died at its first commit, on each
attempt, with InvalidTaskId (report px 6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from troupe.cli.commands import ctl as command
from troupe.cli.main import app

MASTER = "tcp://127.0.0.1:45801"  # never asked: the master is not running


def _submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, *options: str) -> Any:
    def master(*_args: Any) -> dict[str, Any]:
        raise AssertionError("the master was asked")

    monkeypatch.setattr(command, "run_async", master)
    job = tmp_path / "gen.toml"
    job.write_text(f'[job]\nname = "{name}"\nkind = "rec"\ncount = 2\n', encoding="utf-8")
    args = ["ctl", "submit", str(job), "--master", MASTER, *options]
    return CliRunner().invoke(app, args, env={"COLUMNS": "80", "TERM": "dumb"}), job


def test_an_id_whose_task_ids_pass_200_characters_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = "h" * 195
    result, _ = _submit(tmp_path, monkeypatch, "pxgen", "--id", job_id)
    assert result.exit_code == 2, result.output
    shown = repr(job_id)[:57] + "..."
    assert result.stderr == (
        f"error: job id {shown} is 195 characters: its task ids (it, '-' and 6 digits) would be 202, "
        "over the 200 a task id may have (it names a directory); give a job id of at most 193 "
        "characters\n"
    )


def test_a_job_name_that_long_is_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, job = _submit(tmp_path, monkeypatch, "h" * 194)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {job}: [job].name 'hhh"), result.stderr
    assert result.stderr.endswith(
        "is 194 characters: its task ids (it, '-' and 6 digits) would be 201, over the 200 a task id "
        "may have (it names a directory); shorten it to at most 193 characters, or submit the job "
        "under a shorter --id\n"
    )
    assert result.stderr.count("\n") == 1


def test_a_long_name_under_a_short_id_is_submitted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The name's ids are never made then: the --id names the tasks."""
    sent: list[dict[str, Any]] = []

    def master(_fn: Any, _endpoint: str, payload: dict[str, Any], _timeout: float) -> dict[str, Any]:
        sent.append(payload)
        return {"job_id": payload["job_id"], "tasks": 2, "already": False}

    job = tmp_path / "gen.toml"
    job.write_text(f'[job]\nname = "{"h" * 200}"\nkind = "rec"\ncount = 2\n', encoding="utf-8")
    monkeypatch.setattr(command, "run_async", master)
    args = ["ctl", "submit", str(job), "--master", MASTER, "--id", "g" * 193]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    assert [p["job_id"] for p in sent] == ["g" * 193]
