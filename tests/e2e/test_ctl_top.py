"""``troupe ctl top`` against a live node and master: one frame when piped or with ``--once``
(nodes, workers, queues), refreshing in place on a terminal until SIGTERM or Ctrl-C (143 / 130,
at once); one clear line and exit 1 when nothing answers; exit 2 for a bad option."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from support.chaos import TaskMaster
from support.cluster import NodeProc, ctl, free_endpoint, running_node
from troupe.cli.master_client import master_call

pytestmark = pytest.mark.e2e

NODE = """
[node]
master = "{master}"
stop_grace_s = 2

[[workers]]
name = "w-echo"
actors = [{{ name = "echo", class = "troupe.actors.demo.actors:Echo" }}]

[[workers]]
name = "w-relay"
actors = [{{ name = "relay", class = "troupe.actors.demo.actors:Relay" }}]
"""


@pytest.fixture
def joined(tmp_path: Path, master: TaskMaster) -> Iterator[tuple[NodeProc, TaskMaster]]:
    """A node of two workers that joins ``master``, which holds a job nobody runs (3 pending)."""
    with running_node(tmp_path, NODE.format(master=master.endpoint), name="top-node") as node:
        job = {"job": {"name": "idle", "kind": "nobody-runs-this", "count": 3}}
        anyio.run(master_call, master.endpoint, "submit", {"job": job, "source": "test"}, 10.0)
        yield node, master


def test_once_prints_nodes_workers_and_queues(joined: tuple[NodeProc, TaskMaster]) -> None:
    node, master = joined
    for extra in (["--once"], []):  # piped, it prints one frame and exits either way
        out = ctl("ctl", "top", "--node", node.endpoint, "--master", master.endpoint, *extra)
        assert out.returncode == 0, out.stderr
        text = out.stdout
        for expected in ("nodes", "workers", "queues", "top-node", "w-echo", "w-relay", "running"):
            assert expected in text, (expected, text)
        assert "mailbox w-echo/echo" in text and "tasks of job idle" in text, text
        assert "Ctrl-C to quit" not in text, text  # one frame, and the command has ended


def test_nothing_answering_is_one_line_and_exit_1() -> None:
    node, master = free_endpoint(), free_endpoint()
    out = ctl("ctl", "top", "--once", "--node", node, "--master", master)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no node answers at {node}" in lines[0], out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize("option", ["--interval", "--timeout"])
def test_a_bad_interval_or_timeout_is_refused_with_exit_2(option: str) -> None:
    out = ctl("ctl", "top", option, "0")
    assert out.returncode == 2
    assert f"{option} must be a finite number of seconds above 0, got 0" in out.stderr


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_on_a_terminal_it_refreshes_in_place_until_a_stop_signal(
    joined: tuple[NodeProc, TaskMaster], signum: signal.Signals, status: int
) -> None:
    node, master = joined
    leader, follower = pty.openpty()
    args = ["ctl", "top", "--node", node.endpoint, "--master", master.endpoint, "--interval", "0.2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "COLUMNS": "160", "LINES": "60"},
    )
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while seen.count(b"troupe top") < 3 and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                seen += os.read(leader, 65536)
        assert seen.count(b"troupe top") >= 3, seen[-2000:]  # the first frame and two refreshes
        assert b"\x1b[1A\x1b[2K" in seen  # drawn over in place (cursor up, erase line), not appended
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == status
        while select.select([leader], [], [], 0.0)[0]:  # what it wrote as it ended
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # its end of the terminal is closed: all read
                break
            if not chunk:
                break
            seen += chunk
        assert b"stopping gracefully" not in seen  # a view stops nothing: it ends quietly
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(leader)


def test_on_a_terminal_that_is_not_utf8_it_prints_the_frame(joined: tuple[NodeProc, TaskMaster]) -> None:
    """``LC_ALL=C`` with Python's UTF-8 coercion off: the "…" of a cut cell died in a
    UnicodeEncodeError traceback (stdout's surrogateescape is strict for it); it is escaped."""
    node, master = joined
    leader, follower = pty.openpty()
    args = ["ctl", "top", "--node", node.endpoint, "--master", master.endpoint, "--once"]
    not_utf8 = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, **not_utf8, "COLUMNS": "60", "LINES": "60"},  # narrow: cells are cut
    )
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not select.select([leader], [], [], 0.5)[0]:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # its end of the terminal is closed: all read
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=30) == 0, seen[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(leader)
    assert b"Traceback" not in seen and b"top-node" in seen, seen[-3000:]
    assert seen.isascii(), seen[-3000:]
