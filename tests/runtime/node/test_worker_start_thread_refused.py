"""A worker (or any child of a node) that fails before its actors start because a thread could
not be started (its heartbeat's, its parent watch's: a process or memory limit reached) says so
in one line on stderr, the limit named, its traceback in the log file: a run printed a 30-line
traceback above its progress bars, and "can't start new thread" never named a limit (report
rs 1). Thread starts are refused here by a fake; no limit is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from troupe.runtime.node.worker_process import SPEC_ENV, failure_line

WAIT_S = 120.0  # a bound on a child's imports on a loaded machine, not on speed

# The worker's main, its heartbeat thread refused as a process limit refuses it.
WORKER = """
import threading, sys
from troupe.runtime.node import worker_process

real_start = threading.Thread.start

def start(self):
    if self.name.startswith("troupe-heartbeat"):
        raise RuntimeError("can't start new thread")
    real_start(self)

threading.Thread.start = start
from troupe.runtime.node.child import run_and_exit
run_and_exit(worker_process.main)
"""


def test_a_worker_whose_heartbeat_thread_is_refused_says_one_line(tmp_path: Path) -> None:
    spec = {
        "node": "n1",
        "process": "w1",
        "node_endpoint": "tcp://127.0.0.1:1",  # never reached: it fails before it registers
        "bind": "tcp://127.0.0.1:*",
        "log_dir": str(tmp_path),
        "supervisor_addr": ["127.0.0.1", 9],
    }
    done = subprocess.run(
        [sys.executable, "-c", WORKER],
        env={**_env(), SPEC_ENV: json.dumps(spec)},
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("RuntimeError: could not start a thread (can't start new thread): "), lines
    assert "pids.max" in lines[0]
    logged = (tmp_path / "n1.jsonl").read_text()
    assert '"worker_failed"' in logged and "can't start new thread" in logged


def test_any_other_failure_of_a_worker_is_one_line_with_its_traceback_s_place(tmp_path: Path) -> None:
    log_file = tmp_path / "n1.jsonl"
    said = failure_line(ExceptionGroup("unhandled", [KeyError("actors")]), log_file)
    assert said == f"KeyError: 'actors' (traceback in {log_file})"


def test_a_child_refused_a_thread_as_it_starts_says_one_line() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from troupe.runtime.node.child import run_and_exit\n"
            'def main():\n    raise RuntimeError("can\'t start new thread")\n'
            "run_and_exit(main)",
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("RuntimeError: could not start a thread (can't start new thread): ")


def _env() -> dict[str, str]:
    """This environment without a node's variables (a test run inside a node's worker)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TROUPE_")}
