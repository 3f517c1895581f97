"""`troupe logs tail --master` follows the nodes of a live cluster, and the master's own log: a
master and two real nodes.

Lines are made by appending JSON lines to a node's log file, as each process of a node does; the
node streams what its file receives. The master's own lines are made by asking it to do what it
logs (a job submitted). Every wait is bounded; none bounds how fast anything is.
"""

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
from typing import Any

import anyio
import pytest

from support.chaos import TaskMaster, start_master
from troupe.cli.master_client import master_call
from troupe.runtime.testing.plugin import free_endpoint, node_start_command, reap

pytestmark = pytest.mark.e2e

WAIT_S = 60.0  # a bound on waiting for another process, not on its speed


class _Node:
    """A node process joined to the master; stopped and started again at will, always reaped."""

    def __init__(self, tmp: Path, name: str, master: str, extra: str = "") -> None:
        self.name = name
        self.logs = tmp / f"logs-{name}"
        self.config = tmp / f"{name}.toml"
        self.config.write_text(f'[node]\nmaster = "{master}"\nstop_grace_s = 2\n{extra}')
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def file(self) -> Path:
        return self.logs / f"{self.name}.jsonl"

    def start(self) -> None:
        self.endpoint = free_endpoint()
        with open(self.logs.parent / f"{self.name}.out", "ab") as out:
            self.proc = subprocess.Popen(
                node_start_command(self.config, self.name, self.endpoint, self.logs),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.proc is not None:
            assert reap(self.proc, []) == []
            self.proc = None

    def append(self, event: str) -> None:
        """Log one line as one of the node's processes would."""
        # One reading of the clock: seconds from one and nanoseconds from another went back a
        # second at a second's turn, and the tail rightly printed those lines first.
        now = time.time_ns()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 10**9)) + f".{now % 10**9:09d}Z"
        rec = {"timestamp": stamp, "level": "info", "node": self.name, "process": "test", "event": event}
        with self.file.open("a") as f:
            f.write(json.dumps(rec) + "\n")


def _status(master: TaskMaster) -> dict[str, Any]:
    return anyio.run(master_call, master.endpoint, "status", None, 5.0)  # type: ignore[no-any-return]


def _wait_streaming(master: TaskMaster, node: _Node, before: str | None = None) -> str:
    """Wait until the master knows ``node`` alive with a log endpoint other than ``before``."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:  # a bounded poll of the master's state
        assert node.proc is not None and node.proc.poll() is None, f"node {node.name} exited"
        for info in _status(master)["nodes"]:
            if (
                info["node"] == node.name
                and info["alive"]
                and info.get("log_endpoint") not in ("", None, before)
            ):
                return str(info["log_endpoint"])
        time.sleep(0.1)
    raise AssertionError(f"node {node.name} never joined the master with a log stream")


def _wait_published(node: _Node, event: str) -> None:
    """Wait until ``node`` has streamed the line ``event`` (it is then in its recent lines)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:  # a bounded poll of the node's state
        reply = anyio.run(master_call, node.endpoint, "log_recent", {"limit": 1000}, 5.0)
        if any(json.loads(line)["event"] == event for _, line in reply["lines"]):
            return
        time.sleep(0.1)
    raise AssertionError(f"node {node.name} never streamed {event}")


class _Tail:
    """`troupe logs tail --master EP ...` and its output, read line by line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "troupe.cli.main", "logs", "tail", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._buffer = b""
        self.printed: list[dict[str, Any]] = []

    def next_line(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line printed within ``timeout`` seconds, or None."""
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
        rec: dict[str, Any] = json.loads(line)
        self.printed.append(rec)
        return rec

    def wait_for(self, node: _Node, prefix: str) -> str:
        """Append ``prefix-k`` lines to ``node``'s file until the tail prints one; return it."""
        deadline = time.monotonic() + WAIT_S
        k = 0
        while time.monotonic() < deadline:  # a bounded poll of the other process's output
            node.append(f"{prefix}-{k}")
            k += 1
            end = time.monotonic() + 0.3
            while (rec := self.next_line(max(end - time.monotonic(), 0.0))) is not None:
                if str(rec.get("event", "")).startswith(prefix):
                    return str(rec["event"])
        raise AssertionError(f"the tail printed no {prefix} line within {WAIT_S}s")


def _submit_until_printed(master: TaskMaster, tail: _Tail, jobs: list[str]) -> dict[str, Any]:
    """Submit jobs (named on from ``jobs``) until the tail prints the master's ``job_submitted``
    line of one of them; return that line. A line the master logs before the tail's
    subscription takes is lost to it until a later line shows the gap, so it submits again;
    lines of jobs submitted by an earlier call, printed late, are passed over."""
    ours = len(jobs)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:  # a bounded poll of the other process's output
        jobs.append(f"logjob-{len(jobs)}")
        anyio.run(master.submit, jobs[-1], "nap", 1, {})  # no worker runs nap: it only waits
        end = time.monotonic() + 0.3
        while (rec := tail.next_line(max(end - time.monotonic(), 0.0))) is not None:
            if rec.get("event") == "job_submitted" and rec.get("job_id") in jobs[ours:]:
                return rec
    raise AssertionError(f"the tail printed no job_submitted line within {WAIT_S}s")


def _stop_tail(tail: _Tail) -> None:
    """SIGINT ends the tail with 130; what it printed is read to the end."""
    tail.proc.send_signal(signal.SIGINT)
    assert tail.proc.wait(timeout=WAIT_S) == 130
    while tail.next_line(0.0) is not None:
        pass
    assert tail.proc.stderr is not None and b"Traceback" not in tail.proc.stderr.read()


@pytest.fixture
def cluster(master: TaskMaster, tmp_path: Path) -> Iterator[tuple[_Node, _Node]]:
    """Nodes n1 and n2 joined to the master, streaming their logs; always reaped."""
    nodes = (_Node(tmp_path, "n1", master.endpoint), _Node(tmp_path, "n2", master.endpoint))
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            _wait_streaming(master, node)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def test_tail_follows_one_node_live_and_across_its_restart(
    master: TaskMaster, cluster: tuple[_Node, _Node]
) -> None:
    """--node n2 --json prints n2's lines only, as they are logged; after n2 restarts on a new port the
    tail finds it through the master and prints its new lines; SIGINT stops it with 130."""
    n1, n2 = cluster
    n1.append("from-n1-before")
    n2.append("n2-history")
    _wait_published(n2, "n2-history")
    tail = _Tail("--master", master.endpoint, "--node", "n2", "--json", "-n", "50")
    try:
        first = tail.next_line(WAIT_S)
        while first is not None and first["event"] != "n2-history":  # the history: n2's recent lines
            first = tail.next_line(WAIT_S)
        assert first is not None, "n2's recent lines were not shown first"
        tail.wait_for(n2, "live")
        n1.append("from-n1-during")
        n2.append("n2-marker")
        while (rec := tail.next_line(WAIT_S)) is not None and rec["event"] != "n2-marker":
            pass
        assert rec is not None, "n2-marker never printed"

        before = _wait_streaming(master, n2)
        n2.stop()
        n2.start()  # a new endpoint, so a new log endpoint: the tail must connect anew
        assert _wait_streaming(master, n2, before) != before
        tail.wait_for(n2, "restarted")

        tail.proc.send_signal(signal.SIGINT)
        assert tail.proc.wait(timeout=WAIT_S) == 130
        while tail.next_line(0.0) is not None:
            pass
        assert tail.printed and {rec["node"] for rec in tail.printed} == {"n2"}
        events = [rec["event"] for rec in tail.printed]
        assert "node_started" in events  # the restarted node's own line, from its start
        markers = [e for e in events if e.startswith(("live-", "restarted-", "n2-marker", "n2-history"))]
        assert len(markers) == len(set(markers))  # none printed twice (history, catch-up, live)
        assert tail.proc.stderr is not None and b"Traceback" not in tail.proc.stderr.read()
    finally:
        if tail.proc.poll() is None:
            tail.proc.kill()
        tail.proc.communicate(timeout=WAIT_S)


def test_a_ctrl_c_ends_the_tail_quietly(master: TaskMaster, tmp_path: Path) -> None:
    """The tail stops nothing: Ctrl-C ends it with 130 and says nothing, where it said "SIGINT:
    stopping gracefully (Ctrl-C again to stop at once)" as if it had something to stop."""
    node = _Node(tmp_path, "n4", master.endpoint)
    node.start()
    try:
        _wait_streaming(master, node)
        tail = _Tail("--master", master.endpoint, "--json", "-n", "0")
        try:
            tail.wait_for(node, "live")  # it follows the stream: the stop signals are its own now
            tail.proc.send_signal(signal.SIGINT)
            assert tail.proc.wait(timeout=WAIT_S) == 130
        finally:
            if tail.proc.poll() is None:
                tail.proc.kill()
            _, err = tail.proc.communicate(timeout=WAIT_S)
        assert b"stopping gracefully" not in err and b"Traceback" not in err, err
    finally:
        node.stop()


def test_a_node_s_stop_lines_reach_the_tail(master: TaskMaster, tmp_path: Path) -> None:
    """What a node logs as it stops (its workers' exits, node_stopped) came after its stream's last
    poll, and the stream closed without sending it: the tail showed none of it (report lk 4)."""
    echo = '{ name = "echo", class = "troupe.actors.demo.actors:Echo" }'
    node = _Node(tmp_path, "n5", master.endpoint, f'[[workers]]\nname = "w-echo"\nactors = [{echo}]\n')
    node.start()
    try:
        _wait_streaming(master, node)
        tail = _Tail("--master", master.endpoint, "--node", "n5", "--json", "-n", "0")
        try:
            tail.wait_for(node, "live")
            node.stop()  # SIGTERM: its workers stop, it leaves the master, it stops
            while (rec := tail.next_line(WAIT_S)) is not None and rec["event"] != "node_stopped":
                pass
            events = [rec["event"] for rec in tail.printed]
            assert "node_stopped" in events, events[-20:]
            assert "worker_exited" in events, events[-20:]
            _stop_tail(tail)
        finally:
            if tail.proc.poll() is None:
                tail.proc.kill()
            tail.proc.communicate(timeout=WAIT_S)
    finally:
        node.stop()


def test_no_master_or_two_sources_are_one_line_errors(tmp_path: Path) -> None:
    """A master that is not there: exit 1 naming it; --master and --logs together: exit 2."""
    endpoint = free_endpoint()
    out = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "logs", "tail", "--master", endpoint],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env={k: v for k, v in os.environ.items() if k != "TROUPE_MASTER"},
    )
    assert out.returncode == 1 and endpoint in out.stderr and "Traceback" not in out.stderr
    both = subprocess.run(
        [
            sys.executable,
            "-m",
            "troupe.cli.main",
            "logs",
            "tail",
            "--master",
            endpoint,
            "--logs",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env={k: v for k, v in os.environ.items() if k != "TROUPE_MASTER"},
    )
    assert both.returncode == 2 and "--logs" in both.stderr and "--master" in both.stderr


def test_a_node_rotates_its_file_and_the_stream_and_the_files_keep_every_line(
    master: TaskMaster, tmp_path: Path
) -> None:
    """A node with a small log_max_mb rotates its file while lines pour in: the tail prints each line
    once, and the files (rotated ones included) hold each line once."""
    node = _Node(tmp_path, "n3", master.endpoint, "log_max_mb = 0.01\nlog_keep = 50\n")
    node.start()
    try:
        _wait_streaming(master, node)
        tail = _Tail("--master", master.endpoint, "--node", "n3", "--json", "-n", "0")
        try:
            tail.wait_for(node, "warm")
            for i in range(300):
                node.append(f"bulk-{i:03d}-{'x' * 60}")
            while (rec := tail.next_line(WAIT_S)) is not None and not rec["event"].startswith("bulk-299"):
                pass
            tail.proc.send_signal(signal.SIGINT)
            assert tail.proc.wait(timeout=WAIT_S) == 130
        finally:
            if tail.proc.poll() is None:
                tail.proc.kill()
            tail.proc.communicate(timeout=WAIT_S)
        streamed = [r["event"][:8] for r in tail.printed if r["event"].startswith("bulk-")]
        assert streamed == [f"bulk-{i:03d}" for i in range(300)]
        deadline = time.monotonic() + WAIT_S
        while not (node.logs / "n3.jsonl.1").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # a bounded poll: the node rotates at its next look at the file
        files = sorted(node.logs.glob("n3.jsonl*"))
        # 20 kB of lines, rotated at 10 kB: a rotated file exists (the new current file only
        # once a line is written after the rename)
        assert node.logs / "n3.jsonl.1" in files, files
        on_disk = [
            json.loads(line)["event"][:8]
            for f in files
            for line in f.read_text().splitlines()
            if json.loads(line)["event"].startswith("bulk-")
        ]
        assert sorted(on_disk) == streamed
    finally:
        node.stop()


def test_the_master_s_own_lines_are_followed_beside_the_nodes(
    master: TaskMaster, cluster: tuple[_Node, _Node]
) -> None:
    """What only the master logs (a job submitted) is printed among the nodes' lines, named as the
    master's lines name it; the tail followed every node but never the master before."""
    n1, _ = cluster
    name = _status(master)["master"]
    tail = _Tail("--master", master.endpoint, "--json", "-n", "0")
    try:
        tail.wait_for(n1, "live")  # it follows the nodes
        submitted = _submit_until_printed(master, tail, [])
        assert submitted["node"] == name == "master" and submitted["process"] == "master"
        assert submitted["pid"] == master.proc.pid
        _stop_tail(tail)
        assert {"n1", name} <= {rec["node"] for rec in tail.printed}
    finally:
        if tail.proc.poll() is None:
            tail.proc.kill()
        tail.proc.communicate(timeout=WAIT_S)


def test_the_master_s_stream_is_picked_up_again_when_the_master_restarts(
    master: TaskMaster, tmp_path: Path
) -> None:
    """--node master follows the master alone: its recent lines first (-n), then its new ones;
    after the master restarts at its endpoint (a new stream, on a new port) the tail prints the
    new master's lines, its start among them, each line once."""
    jobs: list[str] = []
    tail = _Tail("--master", master.endpoint, "--node", "master", "--json", "-n", "50")
    try:
        first = tail.next_line(WAIT_S)
        assert first is not None and first["event"] in ("log_stream_started", "master_started"), first
        _submit_until_printed(master, tail, jobs)
        before = _status(master)["log_endpoint"]

        assert master.reap() == []
        restarted = start_master(tmp_path / "master", endpoint=master.endpoint)
        master.proc = restarted.proc  # the fixture reaps the master that runs
        assert _status(master)["log_endpoint"] not in (None, before)
        again = _submit_until_printed(master, tail, jobs)
        assert again["pid"] == restarted.proc.pid

        _stop_tail(tail)
        assert {rec["node"] for rec in tail.printed} == {"master"}
        started = [rec["pid"] for rec in tail.printed if rec["event"] == "master_started"]
        assert started == [first["pid"], restarted.proc.pid]  # the history's, and the new one's
        stopped = [rec["pid"] for rec in tail.printed if rec["event"] == "master_stopped"]
        assert stopped == [first["pid"]]  # its stream's last line, sent as it closed
        lines = [(rec["pid"], rec["event"], rec.get("job_id")) for rec in tail.printed]
        assert len(lines) == len(set(lines))  # none printed twice (history, catch-up, live)
    finally:
        if tail.proc.poll() is None:
            tail.proc.kill()
        tail.proc.communicate(timeout=WAIT_S)
