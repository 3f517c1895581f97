"""Real node processes on loopback for end-to-end tests, always reaped.

A node is started with ``python -m troupe.cli.main node start``; the fixture waits (a bounded
poll) until every configured worker answers, and on teardown sends SIGTERM, waits, then
SIGKILLs the node and every process it started, whatever the test did. ``free_endpoint`` and
``reap`` come from the pytest plugin (``troupe.runtime.testing.plugin``), which has the rest of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psutil

from troupe.runtime import Actor, handles
from troupe.runtime.testing.plugin import free_endpoint, node_start_command, reap

__all__ = [
    "DEMO_CONFIG",
    "Cruncher",
    "HangsInConstructor",
    "HangsInStarted",
    "NodeProc",
    "ctl",
    "free_endpoint",
    "reap",
    "start_node",
]


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


def ctl(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run the troupe command and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextmanager
def running_node(tmp_path: Path, config_text: str, name: str = "t") -> Iterator[NodeProc]:
    """A node started from ``config_text``; it and every process it started are reaped on exit."""
    node = start_node(tmp_path, config_text, name)
    children = node.descendants()
    try:
        yield node
    finally:
        reap(node.proc, children + node.descendants())


def start_node(tmp_path: Path, config_text: str, name: str = "t") -> NodeProc:
    """Start a node with ``config_text`` and wait until it and its workers answer."""
    endpoint = free_endpoint()
    config = tmp_path / f"{name}.toml"
    config.write_text(config_text)
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen(
        node_start_command(config, name, endpoint, log_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]

[[workers]]
name = "w-gate"
actors = [
  { name = "gate", class = "troupe.actors.demo.actors:Gate" },
  { name = "opener", class = "troupe.actors.demo.actors:Opener" },
]

[[workers]]
name = "w-relay"
actors = [{ name = "relay", class = "troupe.actors.demo.actors:Relay" }]
"""


class Cruncher(Actor):
    """Long pure-Python work on the worker's loop, with or without ``progress()`` reports.

    Worker processes load it as ``support.cluster:Cruncher`` (with ``tests/`` on PYTHONPATH).
    ``reason`` answers the reason its ``restarted`` hook got (None after a first start).
    """

    restart_reason: str | None = None

    async def restarted(self, reason: str) -> None:
        self.restart_reason = reason

    @handles("reason")
    def reason(self, _: Any) -> str | None:
        return self.restart_reason

    @handles("crunch")
    def crunch(self, payload: Any) -> int:
        end = time.monotonic() + float(payload["seconds"])
        rounds = 0
        while time.monotonic() < end:
            sum(range(2_000))  # pure Python: holds the GIL in slices, never blocks in C
            rounds += 1
            if payload.get("progress") and rounds % 20 == 0:
                self.progress(20, note=f"round {rounds}")
        return rounds


class HangsInConstructor(Actor):
    """An actor whose constructor never returns (waiting on a device, say): its worker beats on."""

    def __init__(self) -> None:
        time.sleep(3600)


class HangsInStarted(Actor):
    """An actor whose ``started()`` hook never returns (nor ``restarted()``, its restart's)."""

    async def started(self) -> None:
        await anyio.sleep(3600)

    async def restarted(self, reason: str) -> None:
        await anyio.sleep(3600)
