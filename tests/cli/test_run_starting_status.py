"""`troupe run` says it is starting while its node's template imports, on a terminal only.

The seconds before the cluster is up (torch's import, tens of them on a slow disk) used to
print nothing. A spinner says what they are; piped output and ``--json`` stay as they were.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import anyio
import pytest
from rich.console import Console

from troupe.cli.commands import run_pipeline as command
from troupe.runtime.testing.plugin import free_endpoint

PIPELINE = """
[pipeline]
name = "starting"
items = 2

[[stages]]
name = "a"
actor = "troupe.actors.bench.synthetic:CostStage"
kwargs = { cost_s = 0.0 }
"""

STARTING = "starting the node"


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, terminal: bool, as_json: bool = False) -> str:
    screen = io.StringIO()
    monkeypatch.setattr(command, "console", Console(file=screen, force_terminal=terminal, width=120))
    tmp_path.mkdir(exist_ok=True)
    toml = tmp_path / "starting.toml"
    toml.write_text(PIPELINE, encoding="utf-8")
    anyio.run(
        command._finish_run,
        toml,
        tmp_path / "out",
        None,
        free_endpoint(),
        free_endpoint(),
        False,
        as_json,
        None,
        backend="asyncio",
    )
    return screen.getvalue()


def test_a_terminal_sees_the_start_said_before_the_node_is_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = _run(tmp_path, monkeypatch, terminal=True)
    assert STARTING in shown
    assert shown.index(STARTING) < shown.index("node up in")


def test_piped_output_and_json_say_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert STARTING not in _run(tmp_path, monkeypatch, terminal=False)
    assert STARTING not in _run(tmp_path / "again", monkeypatch, terminal=True, as_json=True)
    assert json.loads(capsys.readouterr().out)["items"]["ok"] == 2
