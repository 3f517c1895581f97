"""``troupe node start`` and ``troupe master start`` off loopback: refused without keys (one line,
exit status 2, nothing started); started with ``--insecure``, which says so loudly (the log and
``troupe ctl status``)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from troupe.runtime.testing.plugin import reap

pytestmark = pytest.mark.e2e

WAIT_S = 60.0


def _off_loopback_endpoint() -> str:
    """A free TCP port on an IPv4 address of this machine that is not loopback (or skip)."""
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                with socket.socket() as s:
                    try:
                        s.bind((a.address, 0))
                    except OSError:
                        continue
                    return f"tcp://{a.address}:{s.getsockname()[1]}"
    pytest.skip("this machine has no IPv4 address besides loopback")


def troupe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def _ways_out(endpoint: str) -> str:
    return (
        f"endpoint {endpoint!r} is not on loopback and no CURVE keys are configured; pass --keys DIR "
        "(made by `troupe keys generate DIR`) to authenticate and encrypt, or --insecure to listen "
        "unauthenticated"
    )


def test_node_and_master_refuse_to_listen_off_loopback_without_keys(tmp_path: Path) -> None:
    endpoint = _off_loopback_endpoint()
    node = troupe("node", "start", "--endpoint", endpoint, "--logs", str(tmp_path / "logs"))
    assert node.returncode == 2
    assert node.stderr.strip().splitlines() == [f"error: command line: --endpoint: {_ways_out(endpoint)}"]
    master = troupe(
        "master", "start", "--endpoint", endpoint, "--new", "--journal", str(tmp_path / "j.db"),
        "--logs", str(tmp_path / "logs"),
    )  # fmt: skip
    assert master.returncode == 2
    assert master.stderr.strip().splitlines() == [f"error: master endpoint: {_ways_out(endpoint)}"]
    assert not (tmp_path / "j.db").exists() and not (tmp_path / "logs").exists()  # nothing started


def test_insecure_starts_off_loopback_and_says_so(tmp_path: Path) -> None:
    endpoint = _off_loopback_endpoint()
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "node", "start", "--name", "open", "--endpoint",
         endpoint, "--logs", str(log_dir), "--insecure"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while True:  # a bounded poll of the node's state
            assert proc.poll() is None, f"node exited with {proc.returncode}"
            assert time.monotonic() < deadline, "node did not answer within 60 s"
            status = troupe("ctl", "status", "--json", "--node", endpoint, "--timeout", "2")
            if status.returncode == 0:
                break
        children = psutil.Process(proc.pid).children(recursive=True)
        shown = json.loads(status.stdout)["security"]
        assert shown["insecure"] is True and shown["curve"] is False
        table = troupe("ctl", "status", "--node", endpoint)
        assert "insecure: true" in table.stdout
        warned = [
            json.loads(line)
            for path in log_dir.glob("*.jsonl*")
            for line in path.read_text(encoding="utf-8").splitlines()
            if '"insecure"' in line
        ]
        assert any(e["event"] == "insecure" and e["level"] == "warning" for e in warned)
    finally:
        assert not reap(proc, children)
