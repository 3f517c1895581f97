"""A real master and a real node started with ``--metrics 127.0.0.1:PORT``, scraped over HTTP.

The text parses as Prometheus exposition; the node shows as many workers alive as its config
has; a worker SIGKILLed by the test is restarted and its restarts counter rises (a bounded poll);
the master shows the node alive and a submitted job's tasks by state; a metrics port in use is
refused at start in one line, exit 2; ``node start --with-master`` serves both on one port,
each family once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.cluster import ctl, free_endpoint, reap
from support.exposition import strict_families
from troupe.cli.master_client import master_call
from troupe.runtime.testing.plugin import node_start_command

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
kind = "relay"
actors = [{{ name = "relay", class = "troupe.actors.demo.actors:Relay" }}]
"""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_address() -> str:
    """A loopback HOST:PORT that was free a moment ago."""
    return free_endpoint().removeprefix("tcp://")


def scrape(address: str) -> Samples:
    """GET /metrics, read strictly (each family once: promtool's rules), then parsed by
    prometheus-client's own parser."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    strict_families(text)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(found: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in found.items() if n == name and set(labels.items()) <= ls)


def poll(what: str, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """A bounded poll of another process's state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:  # not listening yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Cluster:
    master_endpoint: str
    master_metrics: str
    node_endpoint: str
    node_metrics: str
    node: subprocess.Popen[bytes]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    master_endpoint, master_metrics = free_endpoint(), free_address()
    node_endpoint, node_metrics = free_endpoint(), free_address()
    logs = tmp_path / "logs"
    config = tmp_path / "n1.toml"
    config.write_text(NODE.format(master=master_endpoint))
    master_args = ["master", "start", "--journal", str(tmp_path / "j.db"), "--new", "--endpoint",
                   master_endpoint, "--logs", str(logs), "--metrics", master_metrics]  # fmt: skip
    master = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", *master_args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    node = subprocess.Popen(
        [*node_start_command(config, "n1", node_endpoint, logs), "--metrics", node_metrics],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    children: list[psutil.Process] = []

    def started() -> bool:
        assert node.poll() is None and master.poll() is None, "the node or the master exited"
        found = scrape(node_metrics)  # the workers run, and the supervisor watches them
        return (
            total(found, "troupe_workers", state="running") == 2 and total(found, "troupe_supervisor_up") == 1
        )

    try:
        poll("both workers running", started)
        children = psutil.Process(node.pid).children(recursive=True)
        yield Cluster(master_endpoint, master_metrics, node_endpoint, node_metrics, node)
    finally:
        assert not reap(node, children + _descendants(node))
        assert not reap(master, [])


def _descendants(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_node_metrics_show_the_configured_workers_alive_and_a_kill_as_a_restart(cluster: Cluster) -> None:
    found = scrape(cluster.node_metrics)
    assert total(found, "troupe_workers_alive", node="n1") == 2
    assert total(found, "troupe_workers_alive", node="n1", kind="relay") == 1
    assert total(found, "troupe_worker_restarts_total", worker="w-echo") == 0
    assert total(found, "troupe_mailbox_capacity", process="w-echo", actor="echo") > 0
    assert total(found, "troupe_worker_answered", worker="w-echo") == 1
    assert total(found, "troupe_supervisor_up", node="n1") == 1

    status = ctl("ctl", "status", "--json", "--node", cluster.node_endpoint)
    assert status.returncode == 0, status.stderr
    (echo,) = [w for w in json.loads(status.stdout)["workers"] if w["name"] == "w-echo"]
    os.kill(echo["pid"], signal.SIGKILL)  # a pid of a process this test's node started

    poll(
        "w-echo's restart counted",
        lambda: total(scrape(cluster.node_metrics), "troupe_worker_restarts_total", worker="w-echo") >= 1,
    )
    poll("w-echo again", lambda: total(scrape(cluster.node_metrics), "troupe_workers", state="running") == 2)
    found = scrape(cluster.node_metrics)
    assert total(found, "troupe_worker_exits_total", worker="w-echo", reason="SIGKILL") == 1
    assert total(found, "troupe_worker_restarts_total", worker="w-relay") == 0


def test_master_metrics_show_the_node_alive_and_tasks_by_state(cluster: Cluster) -> None:
    poll("the node joined", lambda: total(scrape(cluster.master_metrics), "troupe_nodes", state="alive") == 1)
    job = {"job": {"name": "idle", "kind": "nobody-runs-this", "count": 4}}
    anyio.run(master_call, cluster.master_endpoint, "submit", {"job": job, "source": "test"}, 10.0)
    found = scrape(cluster.master_metrics)
    assert total(found, "troupe_tasks", master="master", job="idle", state="pending") == 4
    assert total(found, "troupe_jobs", state="running") == 1
    assert total(found, "troupe_nodes", state="dead") == 0
    assert total(found, "troupe_journal_size_bytes") > 0
    assert total(found, "troupe_dispatches_total") == 0  # no worker runs that kind


def test_a_metrics_port_in_use_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        config = tmp_path / "n.toml"
        config.write_text("[node]\nstop_grace_s = 1\n")
        out = ctl(
            *node_start_command(config, "n", free_endpoint(), tmp_path / "logs")[3:], "--metrics", address
        )
        master = ctl("master", "start", "--journal", str(tmp_path / "j.db"), "--new", "--endpoint",
                     free_endpoint(), "--logs", str(tmp_path / "logs"), "--metrics", address)  # fmt: skip
    for run in (out, master):
        assert run.returncode == 2, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and f"metrics {address} is in use" in lines[0], run.stderr


def test_with_master_one_port_serves_the_node_and_the_master(tmp_path: Path) -> None:
    master_endpoint, metrics = free_endpoint(), free_address()
    config = tmp_path / "n.toml"
    config.write_text(NODE.format(master=master_endpoint))
    argv = [*node_start_command(config, "solo", free_endpoint(), tmp_path / "logs"), "--with-master",
            "--journal", str(tmp_path / "j.db"), "--new", "--metrics", metrics]  # fmt: skip
    node = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[psutil.Process] = []

    def joined() -> bool:
        assert node.poll() is None, "the node exited"
        found = scrape(metrics)
        return total(found, "troupe_workers", state="running") == 2 and total(found, "troupe_nodes") == 1

    try:
        poll("the node running and joined", joined)
        children = _descendants(node)
        found = scrape(metrics)
        assert total(found, "troupe_workers_alive", node="solo") == 2
        assert total(found, "troupe_nodes", master="master", state="alive") == 1
        # The process's CURVE families once (ob 1: the master's collector added them again).
        assert [k for k in found if k[0] == "troupe_curve_enabled"] == [
            ("troupe_curve_enabled", frozenset({("node", "solo")}))
        ]
    finally:
        assert not reap(node, children + _descendants(node))
