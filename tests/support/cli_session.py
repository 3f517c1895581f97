"""Run the `troupe` command in its own session, so that a command that should have refused but
started after all is killed with everything it started (its node, workers, template)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["troupe_in_session"]


def troupe_in_session(
    *args: str, timeout: float = 120.0, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``troupe ARGS`` to its end, within ``timeout`` (a bound against a hang, not a measure),
    in ``cwd``, with ``env`` added to this process's environment."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
