"""Two nodes of one master, each on its own address, find each other's actors by name.

Loopback is a whole /8 on Linux: node A listens on 127.0.0.2 and node B on 127.0.0.3, as two
hosts would on their own addresses (tests/e2e/test_netns_cluster.py does it across real
network namespaces, where it can make them). Workers bind their node's address, so the other
node's workers reach them; a node resolves another node's actor through the master, which
knows every node's processes from their beats; a worker's cache of a remote endpoint follows a
restart of that worker at the next miss.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from support.chaos import TaskMaster
from support.cluster import ctl, free_endpoint, running_node
from troupe.runtime import RemoteError, connect
from troupe.runtime.errors import UnknownActor
from troupe.runtime.testing.plugin import node_start_command, reap

pytestmark = pytest.mark.e2e

RELAY = """
[node]
master = "{master}"
ask_timeout_s = 5
stop_grace_s = 2

[[workers]]
name = "w-relay"
actors = [{{ name = "relay", class = "troupe.actors.demo.actors:Relay" }}]
"""

ECHO = """
[node]
master = "{master}"
ask_timeout_s = 5
stop_grace_s = 2

[supervision]
interval_s = 0.1
heartbeat_timeout_s = 2

[[workers]]
name = "w-echo"
actors = [{{ name = "echo", class = "troupe.actors.demo.actors:Echo" }}]
"""


def _endpoint_on(host: str) -> str:
    with socket.socket() as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


async def _node_status(endpoint: str) -> dict[str, Any]:
    async with connect(endpoint) as rt:
        status: dict[str, Any] = await rt.control(endpoint, "status", timeout=10)
        return status


@pytest.fixture
def two_hosts(tmp_path: Path, master: TaskMaster) -> Iterator[tuple[str, str]]:
    procs: list[subprocess.Popen[bytes]] = []
    children: dict[int, list[psutil.Process]] = {}  # each node's own: reaped with it, not before
    endpoints = []
    try:
        for name, host, text in (("a", "127.0.0.2", RELAY), ("b", "127.0.0.3", ECHO)):
            endpoint = _endpoint_on(host)
            config = tmp_path / f"{name}.toml"
            config.write_text(text.format(master=master.endpoint))
            procs.append(
                subprocess.Popen(
                    node_start_command(config, name, endpoint, tmp_path / "logs"),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            )
            endpoints.append(endpoint)
        anyio.run(_wait_joined, master, {"a", "b"})
        for proc in procs:
            children[proc.pid] = psutil.Process(proc.pid).children(recursive=True)
        yield endpoints[0], endpoints[1]
    finally:
        for proc in procs:
            try:
                children.setdefault(proc.pid, []).extend(psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        survivors = [pid for proc in procs for pid in reap(proc, children.get(proc.pid, []))]
        assert not survivors


async def _wait_joined(master: TaskMaster, nodes: set[str]) -> None:
    """Until every node beats with all its workers running (a bounded poll)."""
    with anyio.fail_after(60):
        while True:
            status = await master.call("status")
            up = {n["node"] for n in status["nodes"] if n["alive"]}
            if up >= nodes:
                try:
                    await master.call("resolve", {"address": "echo"})
                    await master.call("resolve", {"address": "relay"})
                    return
                except Exception:
                    pass
            await anyio.sleep(0.1)


def _echo_endpoint(master: TaskMaster) -> str | None:
    try:
        return str(anyio.run(master.call, "resolve", {"address": "echo"})["endpoint"])
    except UnknownActor:
        return None


async def _relay(node: str, payload: Any) -> Any:
    async with connect(node) as rt:
        return await rt.ref("relay").ask("relay", payload, timeout=20)


def test_workers_listen_on_their_nodes_address(two_hosts: tuple[str, str]) -> None:
    _, node_b = two_hosts
    status = anyio.run(_node_status, node_b)
    (worker,) = status["workers"]
    assert worker["endpoint"].startswith("tcp://127.0.0.3:"), worker
    assert all(e.startswith("tcp://127.0.0.3:") for e in worker["actor_endpoints"].values()), worker


def test_an_actor_asks_an_actor_of_another_node_by_name_and_follows_its_restart(
    two_hosts: tuple[str, str], master: TaskMaster
) -> None:
    node_a, node_b = two_hosts
    assert anyio.run(_relay, node_a, {"n": 1}) == {"n": 1}
    before = anyio.run(master.call, "resolve", {"address": "echo"})
    assert before["address"] == "b/w-echo/echo"

    out = ctl("ctl", "chaos", "kill", "--target", "w-echo", "--node", node_b)
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 60
    while _echo_endpoint(master) in (before["endpoint"], None):  # None: restarting, not listed
        assert time.monotonic() < deadline, "the master never learned echo's new mailbox"
        time.sleep(0.1)
    # The relay's cache still names the old mailbox: its next ask times out and forgets it,
    # the one after resolves afresh (a bounded number of tries, no timing asserted).
    for _ in range(3):
        try:
            assert anyio.run(_relay, node_a, {"n": 2}) == {"n": 2}
            break
        except RemoteError:
            continue
    else:
        pytest.fail("the relay never reached echo's new incarnation")


def test_a_name_no_node_knows_is_refused_even_when_the_master_is_down(tmp_path: Path) -> None:
    """Resolving through a master that does not answer ends in the node's own refusal, named."""
    config = RELAY.format(master=free_endpoint())  # nothing listens there
    with running_node(tmp_path, config, name="lonely") as node:

        async def resolve() -> None:
            async with connect(node.endpoint) as rt:
                await rt.control(node.endpoint, "resolve", {"address": "nobody"}, timeout=20)

        with pytest.raises(UnknownActor, match=r"no running actor nobody on node lonely.*nor can the master"):
            anyio.run(resolve)
