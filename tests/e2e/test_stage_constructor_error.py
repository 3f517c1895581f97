"""A stage whose constructor raises is reported in a line or two, not in a worker's traceback.

What a user relies on: ``troupe run`` on a stage that cannot be built (a missing model file, an
unwritable folder) says the error, the class and the line that raised it, and where its
traceback went; the terminal shows none of the worker's own frames (forty lines of anyio and
uvloop, before the run's error). The traceback is in the run's log file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.node.worker_process import start_failure_line

pytestmark = pytest.mark.e2e

STAGES = """
from troupe import StageActor


class Fine(StageActor):
    def process(self, item):
        return item


class Broken(StageActor):
    def __init__(self, model: str = "m.pt"):
        raise FileNotFoundError(f"no model file at {model}")

    def process(self, item):
        return item
"""

PIPELINE = """
[pipeline]
name = "ctor"
items = 2

[[stages]]
name = "fine"
actor = "ctor_stages:Fine"

[[stages]]
name = "broken"
actor = "ctor_stages:Broken"
kwargs = { model = "/nowhere/m.pt" }
"""


def test_a_raising_constructor_is_one_line_naming_where_and_the_log(tmp_path: Path) -> None:
    (tmp_path / "ctor_stages.py").write_text(STAGES, encoding="utf-8")
    (tmp_path / "ctor.toml").write_text(PIPELINE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "400"}
    done = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "run", "ctor.toml", "--out", "out"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode != 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "Traceback" not in said and "ExceptionGroup" not in said, said
    error = [ln for ln in said.splitlines() if ln.startswith("error:")]
    assert len(error) == 1, said
    assert "FileNotFoundError: no model file at /nowhere/m.pt" in error[0]
    assert f"ctor_stages:Broken at {tmp_path / 'ctor_stages.py'}:" in error[0]
    log = tmp_path / "out" / "logs" / "local.jsonl"
    assert f"traceback in {log}" in error[0]
    events = [json.loads(ln) for ln in log.read_text(encoding="utf-8").splitlines()]
    failed = [e for e in events if e["event"] == "actor_start_failed"]
    assert failed and failed[0]["cls"] == "ctor_stages:Broken"
    frames = failed[0]["exception"][-1]["frames"]
    assert any(f["filename"].endswith("ctor_stages.py") for f in frames)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_the_line_is_one_line_and_bounded_whatever_the_message() -> None:
    """A message with newlines or of any length stays one line of bounded size, the exception
    first (the node reads a worker's last error by it)."""
    line = start_failure_line(_raised(ValueError("first\nsecond " + "x" * 5000)), "m:C", None)
    assert "\n" not in line and len(line) < 700
    assert line.startswith("ValueError: first second x") and "..." in line
    assert "raised in m:C at " in line and "traceback in" not in line
    assert start_failure_line(_raised(RuntimeError()), "m:C", Path("/l.jsonl")).startswith(
        "RuntimeError (raised in m:C at "
    )
    refusal = ConfigError("cannot import 'm:C': No module named 'm'")  # troupe's own, whole
    assert start_failure_line(_raised(refusal), "m:C", None) == f"ConfigError: {refusal}"


def test_a_constructor_given_arguments_it_does_not_take_is_not_located_in_the_runtime() -> None:
    """A TypeError of the call itself (a missing kwarg) is raised in the runtime's frame that
    calls the class: it said "raised in m:C at .../runtime/core/runtime.py:319", pointing the
    user into troupe."""

    class Needs:
        def __init__(self, directory: str) -> None:
            self.directory = directory

    from troupe.runtime.node import worker_process

    # The call made from a runtime module (its frame's file is what decides).
    call = compile("Needs()", str(worker_process._RUNTIME_DIR / "core" / "runtime.py"), "exec")
    line = ""
    try:
        exec(call, {"Needs": Needs})
    except TypeError as exc:
        line = start_failure_line(exc, "m:Needs", None)
    assert "missing 1 required positional argument: 'directory'" in line, line
    assert "runtime/core/runtime.py" not in line and "(raised in m:Needs" in line, line
