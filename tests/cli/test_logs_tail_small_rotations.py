"""`troupe logs tail --logs` follows a burst of several processes at a small log size: each writer
rotates the file under the lock, many times between two of the tail's polls, and the tail prints
every line once, each process's in order (it printed a quarter to three quarters of a burst at
``log_max_mb = 0.05``: whole rotated files were skipped, silently)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from troupe.runtime.log_files import history_files

WAIT_S = 60.0  # a bound on waiting for another process, not on its speed
LINES = 300  # of each writer: about 60 KB, 15 rotations of its own at 4 KB

_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import structlog

    from troupe.runtime.logs import configure_logging

    configure_logging("n", sys.argv[2], Path(sys.argv[1]), console=False, rotate_at_bytes=4096, keep=1000)
    log = structlog.get_logger("w")
    for i in range(int(sys.argv[3])):
        log.info("burst", i=i)
    """
)


def _run_writers(logs: Path, count: int) -> None:
    command = [sys.executable, "-c", _WRITER, str(logs)]
    procs = [subprocess.Popen([*command, f"w{k}", str(LINES)]) for k in range(count)]
    try:
        assert [p.wait(timeout=WAIT_S) for p in procs] == [0] * count
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT_S)


def test_tail_prints_every_line_of_a_burst_across_many_rotations(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "n.jsonl"
    path.write_bytes(b"")
    tail = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "logs", "tail", "--logs", str(logs), "-n", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    printed: list[dict[str, object]] = []
    buffer = [b""]

    def read_until(event: str) -> None:
        """Read what the tail prints until ``event`` (raw reads: a buffered readline would hide lines
        from select)."""
        assert tail.stdout is not None
        deadline = time.monotonic() + WAIT_S
        while all(r["event"] != event for r in printed) and time.monotonic() < deadline:
            ready, _, _ = select.select([tail.stdout], [], [], max(deadline - time.monotonic(), 0.0))
            if ready:
                chunk = os.read(tail.stdout.fileno(), 65536)
                assert chunk, "the tail ended"
                *lines, buffer[0] = (buffer[0] + chunk).split(b"\n")
                printed.extend(json.loads(ln) for ln in lines)
        assert any(r["event"] == event for r in printed), printed[-5:]

    def append(event: str) -> None:
        """A line stamped after any writer's: the tail prints each poll's lines in time order."""
        with path.open("ab") as f:
            f.write(json.dumps({"timestamp": "2999-01-01T00:00:00Z", "event": event}).encode() + b"\n")

    try:
        for k in range(int(WAIT_S / 0.2)):  # a bounded poll: until the tail reads the file
            append(f"warmup{k}")
            ready, _, _ = select.select([tail.stdout], [], [], 0.2)
            if ready:
                read_until(f"warmup{k}")
                break
        assert printed, "the tail never printed a line"
        _run_writers(logs, 3)
        append("end")  # after every writer's last line: printed after them
        read_until("end")
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=WAIT_S) == 130
    finally:
        if tail.poll() is None:
            tail.kill()
        _, err = tail.communicate(timeout=WAIT_S)
    assert len(history_files(path)) > 10  # the burst did rotate many times
    for k in range(3):
        numbers = [r["i"] for r in printed if r.get("process") == f"w{k}"]
        assert numbers == list(range(LINES)), f"w{k}: {len(numbers)} of {LINES} printed"
    assert err == b""
