"""A ``troupe run`` stopped while its node starts (seconds of imports: torch's) said "SIGINT:
stopping gracefully" and then nothing, as if the stop had hung or been lost; it says last that
no item ran and that the same command starts the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.cli_scripts import STOPPED_AS_THE_NODE_STARTS
from troupe.cli.commands.run_pipeline import STOPPED_BEFORE

WAIT_S = 120.0  # a bound on a hang, not on speed


def test_a_run_stopped_before_its_node_is_up_says_so_last(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", STOPPED_AS_THE_NODE_STARTS, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 130, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == STOPPED_BEFORE, done.stderr
    assert done.stdout == "", done.stdout
