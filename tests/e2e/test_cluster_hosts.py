"""A master and two real nodes on loopback with different tags: the master's view of them as
placement hosts, replicas placed on the node whose tags they need, the tags in ``troupe ctl
status``, and a dead node left out."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import psutil
import pytest

from support.chaos import TaskMaster
from support.cluster import ctl, free_endpoint
from support.json_doc import undocumented
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.errors import Unreachable
from troupe.runtime.placement import Host, cluster_hosts, place
from troupe.runtime.testing.plugin import node_start_command, reap

pytestmark = pytest.mark.e2e

ENCODER_NODE = """
[node]
master = "{master}"
stop_grace_s = 2
tags = ["encoder", "cpu"]
"""

TRAINER_NODE = """
[node]
master = "{master}"
stop_grace_s = 2
"""


class Nodes:
    """Node processes started by a test, by name, each reaped with what it started."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.endpoints: dict[str, str] = {}
        self.children: dict[str, list[psutil.Process]] = {}

    def start(self, tmp_path: Path, name: str, text: str, *options: str) -> None:
        config = tmp_path / f"{name}.toml"
        config.write_text(text)
        endpoint = free_endpoint()
        self.endpoints[name] = endpoint
        self.procs[name] = subprocess.Popen(
            [*node_start_command(config, name, endpoint, tmp_path / "logs"), *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def stop(self, name: str) -> list[int]:
        proc = self.procs.pop(name)
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        return reap(proc, children)


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    started = Nodes()
    try:
        yield started
    finally:
        survivors = [pid for name in list(started.procs) for pid in started.stop(name)]
        assert not survivors


async def _hosts(master: str, timeout: float = 5.0) -> list[Host]:
    async with process_runtime("test", f"placer-{os.getpid()}", drain_timeout=0.1) as runtime:
        return await cluster_hosts(runtime, master, timeout)


def _wait_hosts(master: str, names: list[str], timeout: float = 60.0) -> list[Host]:
    """The master's hosts once exactly ``names`` are alive with their tags (a bounded poll)."""

    async def poll() -> list[Host]:
        with anyio.fail_after(timeout):
            while True:
                hosts = await _hosts(master)
                if [h.name for h in hosts] == names:
                    return hosts
                await anyio.sleep(0.1)

    return anyio.run(poll)


def test_cluster_hosts_place_replicas_by_tags(
    tmp_path: Path, master: TaskMaster, nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes.start(tmp_path, "enc", ENCODER_NODE.format(master=master.endpoint))
    nodes.start(
        tmp_path, "trn", TRAINER_NODE.format(master=master.endpoint), "--tag", "trainer", "--tag", "gpu-small"
    )
    hosts = _wait_hosts(master.endpoint, ["enc", "trn"])
    cpus = psutil.cpu_count() or 1  # what a node's beat says of its host
    assert hosts == [
        Host("enc", nodes.endpoints["enc"], frozenset({"encoder", "cpu"}), hosts[0].gpus, cpus=cpus),
        Host("trn", nodes.endpoints["trn"], frozenset({"trainer", "gpu-small"}), hosts[1].gpus, cpus=cpus),
    ]
    assert [h.name for h in place(3, hosts, tags=["encoder"])] == ["enc"] * 3
    assert [h.name for h in place(2, hosts, tags=["trainer"])] == ["trn"] * 2
    assert [h.name for h in place(4, hosts)] == ["enc", "trn", "enc", "trn"]

    # The tags, as the node and the master tell them to `troupe ctl status`.
    shown = ctl("ctl", "status", "--json", "--node", nodes.endpoints["trn"], "--master", master.endpoint)
    assert shown.returncode == 0, shown.stderr
    reply = json.loads(shown.stdout)
    assert reply["tags"] == ["trainer", "gpu-small"]
    assert undocumented("troupe ctl status --json", reply) == []  # au 5: in docs/METRICS.md
    assert {n["node"]: n["tags"] for n in reply["master"]["nodes"]} == {
        "enc": ["encoder", "cpu"],
        "trn": ["trainer", "gpu-small"],
    }
    monkeypatch.setenv("COLUMNS", "240")  # the tables' cells in full
    table = ctl("ctl", "status", "--node", nodes.endpoints["enc"], "--master", master.endpoint)
    assert table.returncode == 0, table.stderr
    assert "encoder, cpu" in table.stdout and "trainer, gpu-small" in table.stdout, table.stdout

    # A dead node is not a host.
    assert not nodes.stop("trn")
    anyio.run(master.call, "node_dead", {"node": "trn"})
    assert [h.name for h in anyio.run(_hosts, master.endpoint)] == ["enc"]


def test_cluster_hosts_without_a_master_names_the_endpoint() -> None:
    nowhere = free_endpoint()
    with pytest.raises(Unreachable, match=f"no master answered at {nowhere}"):
        anyio.run(_hosts, nowhere, 0.5)
