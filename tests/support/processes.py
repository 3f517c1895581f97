"""Waiting for processes to be gone, in a bounded poll of the process table."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

__all__ = [
    "gone_within",
    "kill_all_in",
    "left_working_in",
    "reap_if_ours",
    "start_script",
    "started_in_log",
    "working_in",
]


def gone_within(pid: int, seconds: float, reaped: bool = False) -> bool:
    """Whether ``pid`` exits (or is a zombie, only its status left, unless ``reaped`` is
    asked: then its parent must have reaped it too) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            process = psutil.Process(pid)  # raises once it is gone and reaped
            if not reaped and process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def reap_if_ours(pid: int) -> None:
    """Read the exit status of ``pid`` if it ended as a child of this process: an orphan comes
    to this process when it is a child subreaper (an in-process node makes it one), and would
    stay a zombie otherwise."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def working_in(folder: Path) -> list[psutil.Process]:
    """The processes whose working directory is ``folder``: every process a script started
    there, whatever session or parent it has since."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.cwd() == str(folder):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def left_working_in(folder: Path, seconds: float) -> list[psutil.Process]:
    """Those still working in ``folder`` after up to ``seconds`` (empty at once when none)."""
    deadline = time.monotonic() + seconds
    while (left := working_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def start_script(folder: Path, script: str, new_session: bool = False) -> subprocess.Popen[str]:
    """``python SCRIPT`` in ``folder``, with the folder on its import path, its output piped
    (``new_session``: a session of its own, so a signal sent to it reaches it alone)."""
    return subprocess.Popen(
        [sys.executable, script],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(folder)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )


def kill_all_in(folder: Path, proc: subprocess.Popen[str]) -> None:
    """Kill every process working in ``folder`` and ``proc`` itself (reaped): what a failed
    test leaves, stopped whatever its assertions say."""
    for left in [p for p in working_in(folder) if p.pid != proc.pid]:
        left.kill()
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def started_in_log(log: Path, proc: subprocess.Popen[bytes], within_s: float) -> None:
    """Wait (a bounded poll of the file) until ``log`` says ``node_started``; fail where ``proc``
    exits first, or where it does not come within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if log.exists() and "node_started" in log.read_text(encoding="utf-8", errors="replace"):
            return
        assert proc.poll() is None, f"the node exited ({proc.returncode}) before it started"
        time.sleep(0.05)
    raise AssertionError(f"the node did not start within {within_s:g} s")
