"""A piped ``troupe run`` returns when its run ends, though a stage started processes of its own.

A stage's forked child kept the command's stdout and stderr open and ignored SIGTERM (it kept
the worker's handler): ``troupe run ... | tail`` never returned, though troupe itself had
exited. The children are now killed when the run stops their worker. The command's output is
read to its end here, as a pipe's reader does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from troupe.runtime.testing.plugin import free_endpoint, import_path

pytestmark = pytest.mark.e2e

TESTS_DIR = Path(__file__).resolve().parents[1]
RUN_S = 280  # a bound on a hang, never on speed
CHILDREN_LIVE_S = 600  # longer than the run may take: an end of the output means they were killed

PIPELINE = """
[pipeline]
name = "forks"
items = 4

[[stages]]
name = "fork"
actor = "support.descendant_maker:DescendantStage"
kwargs = {{ pids = "{pids}", most_s = {most_s} }}
"""


@pytest.fixture
def pids_file(tmp_path: Path) -> Iterator[Path]:
    """Where the stage writes its children; those still running are killed at the end, whatever
    the test found (each only if its start time is the one written: never a reused pid)."""
    path = tmp_path / "children.jsonl"
    yield path
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for line in lines:
        child = json.loads(line)
        try:
            proc = psutil.Process(child["pid"])
            if proc.create_time() == child["create_time"]:
                proc.kill()
        except psutil.Error:
            pass


@pytest.mark.timeout(RUN_S + 60)
def test_a_piped_run_returns_though_its_stage_left_children(tmp_path: Path, pids_file: Path) -> None:
    pipeline = tmp_path / "forks.toml"
    pipeline.write_text(PIPELINE.format(pids=pids_file, most_s=CHILDREN_LIVE_S), encoding="utf-8")
    command = [sys.executable, "-m", "troupe.cli.main", "run", str(pipeline), "--out", str(tmp_path / "out")]
    command += ["--endpoint", free_endpoint(), "--master", free_endpoint()]
    env = {**os.environ, "PYTHONPATH": import_path(TESTS_DIR)}
    # Read to the end of its output: what a pipe's reader (`| tail`) waits for.
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_S, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "4 ok, 0 pruned, 0 dead" in done.stdout, done.stdout[-2000:]
    children = [json.loads(line)["pid"] for line in pids_file.read_text(encoding="utf-8").splitlines()]
    assert len(children) == 2
