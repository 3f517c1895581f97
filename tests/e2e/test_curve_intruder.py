"""An intruder hits a live node with CURVE keys while good traffic flows (issue 12, "Done when").

The good client (this process, with the operator key) asks an echo actor in a loop and checks
every answer. Meanwhile, from threads of their own: a troupe runtime with a key this cluster
never authorised asks the same actor and sends control messages to the node; raw DEALERs
without keys flood junk at the node's endpoint and at the actor's mailbox; raw TCP connections
write garbage bytes there. Nothing from them is delivered to any actor (the actor handled
exactly the good asks), every good ask is answered with its own value, the node and the
worker count the refused peers, and nothing restarts.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
import zmq

from troupe.runtime import AskTimeout, MailboxFull, Unreachable
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.security.keys import CurveKeys, generate_keys, load_keys
from troupe.runtime.security.process import install
from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import Cluster

pytestmark = pytest.mark.e2e

troupe_cluster = troupe_testing.troupe_cluster

WAIT_S = 60.0  # bound of every wait: a loaded 2-core box may be slow, never wedged
GOOD_ASKS = 300  # at least; the loop goes on until the intruders have been refused
FLOOD = 2000

CONFIG = """
[node]
stop_grace_s = 2
keys = "{keys}"

[[workers]]
name = "w-echo"
actors = [{{ name = "echo", class = "troupe.actors.demo.actors:Echo" }}]
"""


@pytest.fixture
def keys(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "keys"
    generate_keys(directory)
    install(load_keys(directory, None))  # this process talks as the operator
    try:
        yield directory
    finally:
        install(None)


def _stranger(keys: Path, tmp_path: Path) -> CurveKeys:
    generate_keys(tmp_path / "elsewhere")
    other = load_keys(tmp_path / "elsewhere")
    return CurveKeys(other.directory, "stranger", other.public, other.secret, load_keys(keys).public, {})


def _junk_flood(endpoints: list[str], stop: threading.Event) -> None:
    """Raw DEALERs without keys queue junk and troupe-shaped frames; raw TCP writes garbage."""
    with zmq.Context() as ctx:
        socks = []
        try:
            for endpoint in endpoints:
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.SNDHWM, 0)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(endpoint)
                socks.append(sock)
            for i in range(FLOOD):
                for sock in socks:
                    # Refused, the connection may have no pipe to queue on: never wait for one.
                    with contextlib.suppress(zmq.Again):
                        sock.send_multipart([b"\xc1 not msgpack", str(i).encode()], zmq.NOBLOCK)
            while not stop.is_set():
                for endpoint in endpoints:
                    parts = urlsplit(endpoint)
                    try:
                        with socket.create_connection((parts.hostname, parts.port), timeout=5) as raw:
                            raw.sendall(b"\xff" * 10 + b"GET / HTTP/1.0\r\n\r\n" + bytes(range(256)))
                    except OSError:
                        pass  # the node hung up on the garbage first: as it should
                stop.wait(0.02)
        finally:
            for sock in socks:
                sock.close(0)


async def _stranger_asks(keys: CurveKeys, node: str, echo: str, stop: anyio.Event, tries: list[int]) -> None:
    async with process_runtime("x", "stranger", security=keys) as rt:
        rt.directory.learn("c1/w-echo/echo", echo)
        ref = rt.ref("c1/w-echo/echo")
        while not stop.is_set():
            # Never connected, its sends may wait for room that never comes: each try is bounded.
            with anyio.move_on_after(0.2), contextlib.suppress(MailboxFull):
                await ref.tell("echo", "intruder")
            # Refused (Unreachable, said at once) or not answered in time: never delivered.
            with contextlib.suppress(AskTimeout, MailboxFull, Unreachable):
                await rt.control(node, "shutdown", timeout=0.2)
            with contextlib.suppress(AskTimeout, MailboxFull, Unreachable):
                await ref.ask("echo", "intruder", timeout=0.2)
            tries[0] += 1


def _refused(status: dict[str, Any]) -> tuple[int, int]:
    worker = Cluster.worker_in(status, "w-echo")["runtime"]["security"]
    return status["security"]["refused_peers"], worker["refused_peers"]


async def test_an_intruder_and_a_garbage_flood_get_nothing_delivered_and_lose_nothing(
    troupe_cluster: Callable[..., Cluster], keys: Path, tmp_path: Path
) -> None:
    cluster = troupe_cluster(CONFIG.format(keys=keys), "c1")
    echo = (await cluster.control("resolve", {"address": "echo"}))["endpoint"]
    node = cluster.endpoint
    stop_flood = threading.Event()
    flood = threading.Thread(target=_junk_flood, args=([node, echo], stop_flood), daemon=True)
    stop_stranger = anyio.Event()
    tries = [0]
    answered = 0
    try:
        flood.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stranger_asks, _stranger(keys, tmp_path), node, echo, stop_stranger, tries)
            async with cluster.client() as rt:
                ref = rt.ref("echo")
                with anyio.fail_after(WAIT_S * 3):
                    while True:
                        value = {"n": answered, "pad": "x" * (answered % 50)}
                        assert await ref.ask("echo", value, timeout=WAIT_S) == value
                        answered += 1
                        if answered >= GOOD_ASKS and answered % 50 == 0:
                            node_refused, worker_refused = _refused(await cluster.status())
                            if node_refused and worker_refused and tries[0] >= 3:
                                break  # the intruders were at it while good asks flowed
            stop_stranger.set()
    finally:
        stop_flood.set()
        flood.join(WAIT_S)
    assert not flood.is_alive()

    status = await cluster.status()
    worker = Cluster.worker_in(status, "w-echo")
    # Exactly the good asks reached the actor: nothing of the intruders was delivered.
    assert worker["runtime"]["actors"]["echo"]["handled"] == answered
    assert worker["runtime"]["bad_frames"] == 0 and status["runtime"]["bad_frames"] == 0  # not even read
    assert worker["restarts"] == 0 and worker["state"] == "running"
    node_refused, worker_refused = _refused(status)
    assert node_refused > 0 and worker_refused > 0
    assert (await cluster.control("ping"))["node"] == "c1"  # the stranger's shutdown never landed
