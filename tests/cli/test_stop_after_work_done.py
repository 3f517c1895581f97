"""A stop signal that reaches a command whose work is done and said (``run_async`` with
``done_if_returned``: ``troupe run``, a pipeline's or a training's) as its process winds down
(a second or more with torch imported, after the report) stops nothing: it is ignored and the
command exits 0. It exited 130 (``stopped at once: 0 processes killed``), or, once the
interpreter had put the default handlers back, died of the signal, which a shell also reports
as 130, after a complete run's report (nothing said: the process was gone).

The wind-down is the interpreter's own, held as it frees ``__main__``'s objects (after it put
its signal handlers back): ``support.cli_scripts.WORK_DONE_THEN_WINDING_DOWN``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cli_scripts import WORK_DONE_THEN_WINDING_DOWN

WAIT_S = 60.0  # a bound on waiting for another process, not on its speed


def _signalled_once_done(tmp_path: Path, done_if_returned: bool, signum: int) -> tuple[int, str, str]:
    """The script's status and output, signalled ``signum`` as its interpreter winds down."""
    returned, signalled = tmp_path / "held", tmp_path / "signalled"
    flag = "1" if done_if_returned else "0"
    proc = subprocess.Popen(
        [sys.executable, "-c", WORK_DONE_THEN_WINDING_DOWN, flag, str(returned), str(signalled)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not returned.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the wind-down did not begin"
            time.sleep(0.02)
        proc.send_signal(signum)
        signalled.write_text("")
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_as_a_finished_command_winds_down_is_ignored(tmp_path: Path, signum: int) -> None:
    code, out, err = _signalled_once_done(tmp_path, True, signum)
    assert code == 0, err
    assert out == "work done\n" and err == "", err


def test_without_done_if_returned_it_still_dies_of_the_signal_there(tmp_path: Path) -> None:
    """Unchanged for the other commands: nothing told the interpreter to ignore it."""
    code, _, _ = _signalled_once_done(tmp_path, False, signal.SIGINT)
    assert code == -signal.SIGINT
