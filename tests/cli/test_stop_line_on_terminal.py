"""On a terminal, a Ctrl-C's line shows above `troupe run`'s progress bars: written beside them
by a console of its own, it was erased by their next redraw (and a bar drawn twice). The run
is given a pseudo-terminal; the line must come where the display had cleared its own lines
(rich's erase-line sequence, right before it), not glued to a bar's end."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from pathlib import Path

import pytest

ENTRY = "from troupe.cli.entry import main; main()"
BOUND_S = 120.0  # against a hang only
ERASE_LINE = b"\x1b[2K"
SAID = b"SIGINT: stopping gracefully"


def _read_until(fd: int, out: bytearray, wanted: bytes, deadline: float) -> bool:
    while wanted not in out and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                return wanted in out
            if not data:
                return wanted in out
            out += data
    return wanted in out


def _text(out: bytearray) -> str:
    """What the terminal showed, escape sequences left out: where a failure happened, whole."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bytes(out).decode(errors="replace"))[-6000:]


def _reaped(pid: int, deadline: float) -> int | None:
    """The child's wait status once it exits; None if it is still running at ``deadline``."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux pseudo-terminal")
def test_the_stop_line_shows_above_the_progress_bars(tmp_path: Path) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the terminal
        os.chdir(tmp_path)
        os.environ.update({"COLUMNS": "100", "LINES": "30", "TERM": "xterm-256color"})
        os.execv(sys.executable, [sys.executable, "-c", ENTRY, "run", "--out", "out"])
    out = bytearray()
    deadline = time.monotonic() + BOUND_S
    status: int | None = None
    try:
        assert _read_until(fd, out, b"node up", deadline), bytes(out[-2000:])
        while b"store" not in out[out.find(b"node up") :]:  # the bars are drawn
            assert _read_until(fd, out, b"\x00never", min(deadline, time.monotonic() + 0.2)) is False
            assert time.monotonic() < deadline, bytes(out[-2000:])
        os.kill(pid, signal.SIGINT)
        _read_until(fd, out, b"\x00never", deadline)  # to its end
        status = _reaped(pid, deadline)
    finally:
        if status is None:
            os.killpg(pid, signal.SIGKILL)  # pty.fork made it a session leader: its group
            os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 130, _text(out)
    at = bytes(out).find(SAID)
    assert at > 0, bytes(out[-2000:])
    assert bytes(out[:at]).endswith(ERASE_LINE), bytes(out[at - 200 : at + 100])
