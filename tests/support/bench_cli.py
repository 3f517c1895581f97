"""Running a ``troupe bench`` command from a test: its JSON figures, the process always reaped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

__all__ = ["bench_json", "run_bench"]


def run_bench(*args: str, timeout: float = 300) -> tuple[int, str, str]:
    """Run ``troupe bench ARGS``: its exit status, stdout and stderr.

    It runs in a session of its own: on a timeout the whole group goes, the raw peers, masters and
    workers a benchmark starts included.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "bench", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, stdout, stderr


def bench_json(*args: str, timeout: float = 300) -> dict[str, Any]:
    """``troupe bench ARGS --json``'s figures; it must exit 0 (its stderr is the message if not)."""
    code, stdout, stderr = run_bench(*args, "--json", timeout=timeout)
    assert code == 0, stderr
    figures: dict[str, Any] = json.loads(stdout)
    return figures
