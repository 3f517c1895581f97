"""`troupe run` keeps stdout for its own report: what the processes it starts print goes to stderr.

A stage module that prints as it imports (in the node's template, started at the command's
entry) or a ``process`` that prints (in a replica) wrote into ``troupe run --json``'s object, and
``| jq`` failed. What a user relies on: stdout parses as the JSON object, and the prints are
still there, on stderr.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

STAGES = """
print("imported: a stage module that talks")

from troupe import StageActor


class Talk(StageActor):
    def process(self, item):
        print("processing", item["task_id"])
        return {"task_id": item["task_id"]}
"""
PIPELINE = """
[pipeline]
name = "talk"
items = 3

[[stages]]
name = "talk"
actor = "talking_stages:Talk"
"""
ENTRIES = {
    "console-script": ["-c", "from troupe.cli.entry import main; main()"],  # the template started ahead
    "module": ["-m", "troupe.cli.main"],  # the run starts it
}


def _run(tmp_path: Path, entry: str, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "talking_stages.py").write_text(STAGES, encoding="utf-8")
    (tmp_path / "talk.toml").write_text(PIPELINE, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, *ENTRIES[entry], "run", "talk.toml", "--out", str(tmp_path / "out"), *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_json_on_stdout_and_what_the_stages_print_on_stderr(tmp_path: Path, entry: str) -> None:
    done = _run(tmp_path, entry, "--json")
    assert json.loads(done.stdout)["items"]["ok"] == 3, "stdout is the JSON object alone"
    assert "imported: a stage module that talks" in done.stderr
    assert "processing" in done.stderr


def test_the_report_without_json_is_on_stdout_and_the_prints_are_not(tmp_path: Path) -> None:
    done = _run(tmp_path, "console-script")
    assert "node up in" in done.stdout
    # where its node listens, for `troupe ctl status --node` (ctl's own default is another port)
    assert re.search(r"node up in [0-9.]+ s at tcp://127\.0\.0\.1:\d+; running 3 items", done.stdout)
    assert "processing" not in done.stdout and "imported:" not in done.stdout
    assert "processing" in done.stderr
