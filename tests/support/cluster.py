"""Real node processes on loopback for end-to-end tests, always reaped.

A node is started with ``python -m troupe.cli.main node start``; the fixture waits (a bounded
poll) until every configured worker answers, and on teardown sends SIGTERM, waits, then
SIGKILLs the node and every process it started, whatever the test did.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


def free_endpoint() -> str:
    """A loopback endpoint on a port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@dataclass
class NodeProc:
    """A running node process and where to reach it."""

    proc: subprocess.Popen[bytes]
    endpoint: str
    name: str
    log_dir: Path

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


def reap(proc: subprocess.Popen[bytes], extra: list[psutil.Process], grace: float = 10.0) -> None:
    """SIGTERM, wait ``grace``, SIGKILL; then make sure ``extra`` processes are gone too."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for p in extra:
        try:
            p.wait(timeout=5)
        except psutil.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
        except psutil.NoSuchProcess:
            pass


def ctl(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run the troupe command and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def start_node(tmp_path: Path, config_text: str, name: str = "t") -> NodeProc:
    """Start a node with ``config_text`` and wait until it and its workers answer."""
    endpoint = free_endpoint()
    config = tmp_path / f"{name}.toml"
    config.write_text(config_text)
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "node", "start", "--config", str(config),
         "--name", name, "--endpoint", endpoint, "--logs", str(log_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    node = NodeProc(proc, endpoint, name, log_dir)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # bounded poll of a condition, not a sleep-and-hope
        if proc.poll() is not None:
            raise RuntimeError(f"node exited early with {proc.returncode}")
        out = ctl("ctl", "status", "--json", "--node", endpoint, "--timeout", "1")
        if out.returncode == 0 and '"state": "starting"' not in out.stdout:
            return node
    reap(proc, node.descendants())
    raise RuntimeError("node did not become ready within 60 s")


DEMO_CONFIG = """
[node]
hwm = 8
ask_timeout_s = 10

[[workers]]
name = "w-echo"
actors = [{ name = "echo", class = "troupe.actors.demo:Echo" }]

[[workers]]
name = "w-gate"
actors = [
  { name = "gate", class = "troupe.actors.demo:Gate" },
  { name = "opener", class = "troupe.actors.demo:Opener" },
]

[[workers]]
name = "w-relay"
actors = [{ name = "relay", class = "troupe.actors.demo:Relay" }]
"""


