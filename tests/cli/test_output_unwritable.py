"""A command whose stdout cannot be written (``> run.log`` on a full disk: /dev/full here) says
so in one line on stderr and exits 1: it printed a traceback of whatever wrote. ``troupe run``
goes on to its end first (its product is --out, not its screen): its first line used to cancel
it before any item, and ``--json`` lost its report once the items were written."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from troupe.runtime.transports.loopback import free_endpoint

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="Linux's /dev/full")

ENTRY = "from troupe.cli.entry import main; main()"
BOUND_S = 120  # against a hang only
SAID = "error: cannot write the output (No space left on device)"
RUN_SAID = SAID + ": the run went on without it; run the same command again to see where it stands"
PIPELINE = """
[pipeline]
name = "full"
items = 3

[[stages]]
name = "a"
actor = "troupe.actors.bench.synthetic:CostStage"
kwargs = { cost_s = 0.0 }
"""


def _troupe(args: list[str], cwd: Path, full: bool = True) -> tuple[int, str, str, set[int]]:
    """``troupe ARGS`` through the console script's entry, stdout /dev/full (or a pipe): its
    status, stdout, stderr, and what it left running in its session."""
    with open("/dev/full", "w") if full else contextlib.nullcontext(subprocess.PIPE) as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", ENTRY, *args],
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        try:
            out, err = proc.communicate(timeout=BOUND_S)
        finally:
            left = {p.pid for p in psutil.process_iter(["pid"]) if _session(p) == proc.pid}
            if proc.poll() is None or left:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return proc.returncode, out or "", err, left


def _session(p: psutil.Process) -> int | None:
    try:
        return os.getsid(p.pid)
    except OSError:
        return None


@pytest.mark.parametrize(
    "args",
    [["--version"], ["--help"], ["demo", "--endpoint", "<free>"]],
    ids=["click-echo", "rich-help", "demo-task-group"],
)
def test_an_unwritable_output_ends_the_command_in_one_line(tmp_path: Path, args: list[str]) -> None:
    args = [free_endpoint() if a == "<free>" else a for a in args]
    code, _, err, left = _troupe(args, tmp_path)
    assert code == 1 and err.strip() == SAID, err
    assert left == set()  # the demo's node is gone with its workers


@pytest.mark.parametrize("as_json", [False, True], ids=["plain", "json"])
def test_a_run_with_an_unwritable_output_commits_its_items_then_says_so(
    tmp_path: Path, as_json: bool
) -> None:
    (tmp_path / "full.toml").write_text(PIPELINE, encoding="utf-8")
    run = ["run", "full.toml", "--out", "out", "--endpoint", free_endpoint(), "--master", free_endpoint()]
    code, _, err, left = _troupe([*run, *(["--json"] if as_json else [])], tmp_path)
    assert code == 1, err
    assert err.strip().splitlines()[-1] == RUN_SAID and "Traceback" not in err, err
    assert left == set()
    code, out, err, _ = _troupe(run, tmp_path, full=False)  # stdout a pipe now
    assert code == 0, err
    assert "already complete" in out, out  # the first run did every item
