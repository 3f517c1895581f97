"""A stop signal a command was started with ignored stays ignored: ``nohup troupe node start``
(the README's way to keep a node past its ssh session) had the node stop with the session, as
troupe handled SIGHUP over nohup's ignore; a shell script's background job, started with SIGINT
ignored, stopped on SIGINT once troupe's handler was in and not before. SIGTERM still stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import started_in_log
from troupe.runtime.testing.plugin import free_endpoint

WITHIN_S = 60.0  # a bound on a start or a stop on a loaded machine, not on speed


def _masks(pid: int) -> tuple[set[int], set[int]]:
    """The signals ``pid`` ignores and those it handles (/proc/PID/status: SigIgn, SigCgt)."""
    masks = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("SigIgn", "SigCgt"):
            bits = int(value.strip(), 16)
            masks[key] = {n for n in range(1, 65) if bits >> (n - 1) & 1}
    return masks["SigIgn"], masks["SigCgt"]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("ignored", [signal.SIGHUP, signal.SIGINT], ids=["nohup", "script-background"])
def test_a_node_started_with_a_stop_signal_ignored_keeps_ignoring_it(
    tmp_path: Path, ignored: signal.Signals
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "node", "start", "--name", "nh",
         "--endpoint", free_endpoint(), "--logs", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(ignored, signal.SIG_IGN),  # what nohup, or the shell, does
    )  # fmt: skip
    try:
        started_in_log(tmp_path / "nh.jsonl", proc, WITHIN_S)  # its stop signals are handled from before that
        ignores, catches = _masks(proc.pid)
        assert ignored in ignores and ignored not in catches, (ignores, catches)
        assert signal.SIGTERM in catches
        os.kill(proc.pid, ignored)
        os.kill(proc.pid, signal.SIGTERM)  # the stop that counts: its status says which came first
        _, err = proc.communicate(timeout=WITHIN_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err.decode(errors="replace")
    assert signal.Signals(ignored).name not in err.decode(errors="replace")
