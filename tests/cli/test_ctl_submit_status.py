"""`troupe ctl submit` says what it waits for while the master takes a big job in, on a
terminal only: a million tasks take the master seconds, which used to print nothing."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.text import Text

from troupe.cli.commands import ctl as command

TAKING = "the master is taking in job"


def _submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, terminal: bool) -> tuple[str, str]:
    screen, out = io.StringIO(), io.StringIO()
    monkeypatch.setattr(command, "err_console", Console(file=screen, force_terminal=terminal, width=120))
    monkeypatch.setattr(command, "console", Console(file=out, force_terminal=False, width=120))

    def master(_fn: Any, _endpoint: str, payload: dict[str, Any], _timeout: float) -> dict[str, Any]:
        return {"job_id": payload["job"]["job"]["name"], "tasks": count, "already": False}

    monkeypatch.setattr(command, "run_async", master)
    job = tmp_path / "big.toml"
    job.write_text(f'[job]\nname = "big"\nkind = "k"\ncount = {count}\n', encoding="utf-8")
    command.submit(job, master="tcp://127.0.0.1:1", job_id=None, as_json=False, timeout=60.0, keys=None)
    # a status is drawn, then erased: its text stays in what was written to the screen
    return Text.from_ansi(screen.getvalue()).plain, out.getvalue()


def test_a_big_job_is_waited_for_with_a_status_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen, out = _submit(tmp_path, monkeypatch, 1_000_000, terminal=True)
    assert f"{TAKING} big: 1,000,000 tasks" in screen
    assert "submitted job big: 1000000 tasks" in out


@pytest.mark.parametrize(("count", "terminal"), [(1_000_000, False), (10, True)])
def test_piped_output_and_small_jobs_show_no_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, terminal: bool
) -> None:
    screen, out = _submit(tmp_path, monkeypatch, count, terminal)
    assert TAKING not in screen and "submitted job big" in out
