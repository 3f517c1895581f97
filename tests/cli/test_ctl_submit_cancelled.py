"""`troupe ctl submit` of a job that was cancelled before is refused, exit 1, with `--json` too:
nothing was submitted, and the JSON form exited 0 with `"already": true`, which a script (the
shipped Slurm script among them) reads as a job submitted."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import typer
from rich.console import Console

from troupe.cli import client
from troupe.cli.commands import ctl as command

REPLY = {"job_id": "nap", "tasks": 3, "already": True, "state": "cancelled"}


@pytest.mark.parametrize("as_json", [False, True], ids=["plain", "json"])
def test_a_cancelled_job_submitted_again_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    errors = io.StringIO()
    monkeypatch.setattr(client, "err_console", Console(file=errors, force_terminal=False, width=300))
    monkeypatch.setattr(command, "run_async", lambda *_args: dict(REPLY))
    job = tmp_path / "nap.toml"
    job.write_text('[job]\nname = "nap"\nkind = "nap"\ncount = 3\n', encoding="utf-8")
    with pytest.raises(typer.Exit) as ended:
        command.submit(job, master="tcp://127.0.0.1:1", job_id=None, as_json=as_json, timeout=60.0, keys=None)
    assert ended.value.exit_code == 1
    assert "error: job nap was submitted before and cancelled" in errors.getvalue()
    out = capsys.readouterr().out
    assert (json.loads(out) == REPLY) if as_json else out == ""


def test_a_job_submitted_again_with_the_same_content_exits_0_in_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(command, "run_async", lambda *_args: {**REPLY, "state": "running"})
    job = tmp_path / "nap.toml"
    job.write_text('[job]\nname = "nap"\nkind = "nap"\ncount = 3\n', encoding="utf-8")
    command.submit(job, master="tcp://127.0.0.1:1", job_id=None, as_json=True, timeout=60.0, keys=None)
    assert json.loads(capsys.readouterr().out)["state"] == "running"
