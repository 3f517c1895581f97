"""A command started with stdin, stdout or stderr closed (``>&-``, a daemon wrapper, cron) runs
as if it were ``/dev/null`` (finding au 1, au 3): uvloop's loop took the free descriptor and
libuv aborted the process as it closed it (``troupe ctl status >&-``: SIGABRT, exit 134; a node so
started, at its stop), and a node stopped by SIGTERM with its stdout closed ended with tracebacks
and exit 1 rather than 143. Through the console script's entry (``python -m troupe``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from support.processes import started_in_log
from troupe.runtime.testing.plugin import free_endpoint

WITHIN_S = 60.0  # a bound on a start or a stop on a loaded machine, not on speed


def _closing(*fds: int) -> Callable[[], None]:
    """What a shell's ``>&-`` does, in the child before it runs the command."""

    def close() -> None:
        for fd in fds:
            os.close(fd)

    return close


def _troupe(*args: str) -> list[str]:
    return [sys.executable, "-m", "troupe", *args]


@pytest.mark.parametrize("closed", [0, 1, 2], ids=["stdin", "stdout", "stderr"])
def test_a_ctl_command_with_a_stream_closed_answers_as_with_it_open(tmp_path: Path, closed: int) -> None:
    nobody = free_endpoint()  # no node there: the command's one-line answer, exit 1
    done = subprocess.run(
        _troupe("ctl", "status", "--node", nobody),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL if closed != 0 else None,
        stdout=subprocess.PIPE if closed != 1 else None,
        stderr=subprocess.PIPE if closed != 2 else None,
        preexec_fn=_closing(closed),
        timeout=WITHIN_S,
        check=False,
    )
    assert done.returncode == 1, (done.returncode, done.stderr)  # 134 (SIGABRT) before
    if closed != 2:
        err = done.stderr.decode(errors="replace")
        assert "no node answers" in err and "Assertion" not in err, err


def test_a_node_with_stdin_and_stdout_closed_stops_on_sigterm_as_143(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        _troupe("node", "start", "--name", "nc", "--endpoint", free_endpoint(), "--logs", str(tmp_path)),
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_closing(0, 1),
    )
    try:
        started_in_log(tmp_path / "nc.jsonl", proc, WITHIN_S)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=WITHIN_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = err.decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGTERM, said  # 134 (libuv's abort) before
    assert "Traceback" not in said and "Assertion" not in said, said
