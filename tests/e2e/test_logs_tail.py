"""`troupe logs tail` as a user runs it: history in time order, -n 0, following, and stopping on a signal."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cluster import ctl

pytestmark = pytest.mark.e2e

WAIT_S = 30.0  # a bound on waiting for the other process, not on its speed


def _line(stamp: str, node: str, event: str) -> str:
    return (
        json.dumps(
            {
                "timestamp": f"2026-01-01T00:00:{stamp}Z",
                "level": "info",
                "node": node,
                "process": "node",
                "event": event,
            }
        )
        + "\n"
    )


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """Two nodes' files whose lines interleave in time: a at 01, 03, 05; b at 02, 04 (+ a non-JSON line)."""
    d = tmp_path / "logs"
    d.mkdir()
    (d / "a.jsonl").write_text(_line("01", "a", "a1") + _line("03", "a", "a3") + _line("05", "a", "a5"))
    (d / "b.jsonl").write_text(_line("02", "b", "b2") + "not json\n" + _line("04", "b", "b4"))
    return d


def _events(stdout: str) -> list[str]:
    return [ln.split()[-1] for ln in stdout.splitlines()]


def test_history_is_the_last_lines_of_all_files_in_time_order(logs: Path) -> None:
    """-n N shows the N latest lines across every file, interleaved by timestamp; unstamped lines keep their
    place."""
    out = ctl("logs", "tail", "--logs", str(logs), "--no-follow", "-n", "3")
    assert out.returncode == 0, out.stderr
    assert _events(out.stdout) == ["a3", "b4", "a5"]
    every = ctl("logs", "tail", "--logs", str(logs), "--no-follow")
    assert _events(every.stdout) == ["a1", "b2", "json", "a3", "b4", "a5"]


def test_no_history_prints_nothing(logs: Path) -> None:
    """-n 0 --no-follow prints nothing at all and exits 0."""
    out = ctl("logs", "tail", "--logs", str(logs), "--no-follow", "-n", "0")
    assert (out.returncode, out.stdout) == (0, "")


def test_a_negative_line_count_is_refused(logs: Path) -> None:
    """-n -1 exits 2 with one line that names -n and the value."""
    out = ctl("logs", "tail", "--logs", str(logs), "--no-follow", "-n", "-1")
    assert out.returncode == 2
    assert "-n" in out.stderr and "-1" in out.stderr and "Traceback" not in out.stderr


class _Follower:
    """`troupe logs tail -n 0` following a directory, and its output read line by line."""

    def __init__(self, logs: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "troupe.cli.main", "logs", "tail", "--logs", str(logs), "-n", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._buffer = b""

    def next_line(self, timeout: float) -> str | None:
        """The next complete line printed within ``timeout`` seconds, or None."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0.0))
            if not ready:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


@pytest.fixture
def follower(logs: Path) -> Iterator[_Follower]:
    """A follower of ``logs``; always reaped."""
    f = _Follower(logs)
    try:
        yield f
    finally:
        if f.proc.poll() is None:
            f.proc.kill()
        f.proc.communicate(timeout=WAIT_S)


def _following(follower: _Follower, logs: Path) -> None:
    """Append lines until the follower prints one: from then on it reads a.jsonl as it grows."""
    deadline = time.monotonic() + WAIT_S
    k = 0
    while time.monotonic() < deadline:  # a bounded poll of the other process's output
        with (logs / "a.jsonl").open("a") as f:
            f.write(_line("06", "a", f"ping{k}"))
        if follower.next_line(0.2) is not None:
            return
        k += 1
    raise AssertionError(f"the follower printed nothing within {WAIT_S}s")


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_following_prints_new_complete_lines_and_a_stop_signal_ends_it(
    follower: _Follower, logs: Path, signum: int, status: int
) -> None:
    """New lines are followed (a half-written line only once complete); SIGTERM/SIGINT exit 143/130 at
    once."""
    _following(follower, logs)
    full = _line("07", "a", "a7")
    with (logs / "a.jsonl").open("a") as f:
        f.write(full[:20])
        f.flush()
        late = [follower.next_line(0.5)]  # a ping printed late, at most; never half a line
        f.write(full[20:])
    while (line := follower.next_line(WAIT_S)) is not None and "ping" in line:
        late.append(line)
    assert all(ln is None or ln.split()[-1].startswith("ping") for ln in late), late
    assert line is not None and line.split() == ["2026-01-01T00:00:07Z", "info", "a", "node", "a7"]
    follower.proc.send_signal(signum)
    assert follower.proc.wait(timeout=WAIT_S) == status
    assert follower.next_line(0.0) is None
    assert follower.proc.stderr is not None and b"Traceback" not in follower.proc.stderr.read()


def test_a_folder_with_no_log_says_so(tmp_path: Path) -> None:
    """--logs at a folder that holds no node's log (a wrong folder): a note on stderr, not
    silence; stdout stays empty."""
    out = ctl("logs", "tail", "--logs", str(tmp_path), "--no-follow")
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert f"no node's log (*.jsonl) in {tmp_path}" in " ".join(out.stderr.split())


def test_a_folder_not_made_yet_is_waited_for(tmp_path: Path) -> None:
    """A tail started before the node made its --logs folder (au 7) said it "is not a
    directory" and exited 2: it waits for the folder as for a first log, saying so once."""
    logs = tmp_path / "logs"
    follower = _Follower(logs)
    err = b""
    try:
        assert follower.proc.stderr is not None
        deadline = time.monotonic() + WAIT_S
        while b"waiting for" not in err and time.monotonic() < deadline:  # bounded: its note first
            if select.select([follower.proc.stderr], [], [], max(deadline - time.monotonic(), 0.0))[0]:
                err += os.read(follower.proc.stderr.fileno(), 65536) or b"(closed)"
        assert b"waiting for" in err, err
        logs.mkdir()
        _following(follower, logs)
        follower.proc.send_signal(signal.SIGINT)
        assert follower.proc.wait(timeout=WAIT_S) == 130
    finally:
        if follower.proc.poll() is None:
            follower.proc.kill()
        err += follower.proc.communicate(timeout=WAIT_S)[1]
    said = " ".join(err.decode().split())
    assert said.count("waiting for a node to write its log there") == 1, said
    assert f"{logs} does not exist (yet)" in said and "error" not in said, said
