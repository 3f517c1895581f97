"""A peer that floods and never reads cannot stop a process from serving the others
(DESIGN.md, invariant 7), and the supervisor is not fooled by a worker whose messages wait.

The hostile peer is a raw pyzmq DEALER written from docs/PROTOCOL.md alone: it sends thousands
of bad frames (and asks whose replies it never reads) to an actor's mailbox and to a node's
endpoint, then closes with linger 0. Everything else must still be answered: that actor,
another actor of its worker, the node, ``ctl status``; and the node still obeys SIGTERM.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import msgpack
import psutil
import pytest
import zmq

from support.cluster import ctl
from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import Cluster

pytestmark = pytest.mark.e2e

troupe_cluster = troupe_testing.troupe_cluster

ASK, ERROR, CONTROL = 2, 4, 5
FLOOD = 10_000
GRACE_S = 2.0
WAIT_S = 60.0  # bound of every poll: a loaded 2-core box may be slow, never wedged

FLOODED = f"""
[node]
stop_grace_s = {GRACE_S}

[[workers]]
name = "w-echo"
actors = [
  {{ name = "echo", class = "troupe.actors.demo.actors:Echo" }},
  {{ name = "greeter", class = "troupe.actors.demo.actors:Greeter" }},
]
"""


def _header(kind: int, msg_id: int, target: str, msg_type: str, payload: Any = None) -> bytes:
    return msgpack.packb(
        [1, kind, msg_id, 0, "hostile/py", target, msg_type, time.time() + 60, None, None, payload]
    )


def _control(endpoint: str, msg_type: str, payload: Any = None) -> Any:
    """One control message from a well-behaved raw client; its reply's payload."""
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send(_header(CONTROL, 1, "", msg_type, payload))
        assert sock.poll(int(WAIT_S * 1000)), f"no reply to {msg_type} from {endpoint}"
        reply = msgpack.unpackb(sock.recv())
    assert reply[1] != ERROR, reply[10]
    return reply[10]


@contextmanager
def _hostile(endpoint: str) -> Iterator[zmq.Socket[bytes]]:
    """A DEALER that never reads; on leaving, it vanishes with whatever was unread (linger 0)."""
    with zmq.Context() as ctx:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDHWM, 0)  # queue the whole flood here: a send never waits
        sock.setsockopt(zmq.RCVHWM, 1)  # and hold next to nothing of what comes back
        sock.setsockopt(zmq.RCVBUF, 4096)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        try:
            yield sock
        finally:
            sock.close(0)


async def _until(cluster: Cluster, predicate: Any) -> dict[str, Any]:
    """Poll the node's full status (which asks the worker) until ``predicate`` holds."""
    with anyio.fail_after(WAIT_S):
        while True:
            status = await cluster.status(timeout=WAIT_S)
            if predicate(status):
                return status
            await anyio.sleep(0.05)


def _junk(runtime: dict[str, Any]) -> int:
    """The bad frames a process read: decoded and refused, or dropped unread (throttled)."""
    return int(runtime["bad_frames"] + runtime["dropped_from_throttled"])


async def _served(cluster: Cluster) -> None:
    async with cluster.client() as rt:
        assert await rt.ref("echo").ask("echo", "still here", timeout=WAIT_S) == "still here"
        assert await rt.ref("greeter").ask("greet", "you", timeout=WAIT_S) == "hello, you"
    assert _control(cluster.endpoint, "ping")["node"] == cluster.name


async def test_a_flood_to_an_actor_that_reads_nothing_leaves_every_peer_served(troupe_cluster: Any) -> None:
    cluster: Cluster = troupe_cluster(FLOODED, "hp")
    echo = _control(cluster.endpoint, "resolve", {"address": "echo"})["endpoint"]
    with _hostile(echo) as bad, _hostile(echo) as deaf:
        for i in range(FLOOD):
            bad.send(b"\xc1 not msgpack")
            deaf.send(_header(ASK, i + 1, "echo", "echo", "x" * 2000))  # 20 MB of replies
        # Served while the flood is read, and once it is all in; then the peers vanish.
        await _served(cluster)
        await _until(
            cluster,
            lambda s: (
                _junk(Cluster.worker_in(s, "w-echo")["runtime"]) >= FLOOD
                and Cluster.worker_in(s, "w-echo")["runtime"]["actors"]["echo"]["handled"] >= FLOOD
            ),
        )
    await _served(cluster)

    # The counters a user sees, through the command line.
    out = await anyio.to_thread.run_sync(lambda: ctl("ctl", "status", "--json", "--node", cluster.endpoint))
    assert out.returncode == 0, out.stderr
    worker = Cluster.worker_in(json.loads(out.stdout), "w-echo")
    assert worker["state"] == "running" and worker["restarts"] == 0
    runtime = worker["runtime"]
    assert _junk(runtime) == FLOOD
    assert runtime["dropped_from_throttled"] > FLOOD // 2  # a few answers per peer, then throttled
    assert runtime["actors"]["echo"]["replies_dropped"] > 0  # the asker read none of its replies
    assert runtime["actors"]["greeter"]["replies_dropped"] == 0
    assert runtime["replies_dropped"] >= runtime["actors"]["echo"]["replies_dropped"]


async def test_a_flood_to_the_node_leaves_it_serving_and_it_still_obeys_sigterm(troupe_cluster: Any) -> None:
    cluster: Cluster = troupe_cluster(FLOODED, "hn")
    with _hostile(cluster.endpoint) as bad, _hostile(cluster.endpoint) as deaf:
        for i in range(FLOOD):
            bad.send(b"\xc1 not msgpack")
            deaf.send(_header(CONTROL, i + 1, "", "ping"))
        await _served(cluster)
        status = await _until(cluster, lambda s: _junk(s["runtime"]) >= FLOOD)
    assert status["runtime"]["dropped_from_throttled"] > FLOOD // 2
    await _served(cluster)

    children = cluster.descendants()
    assert children  # its supervisor and worker
    cluster.proc.send_signal(signal.SIGTERM)
    try:
        code = await anyio.to_thread.run_sync(lambda: cluster.proc.wait(timeout=WAIT_S))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the node ignored SIGTERM for {WAIT_S} s after a flood (its grace is {GRACE_S} s)")
    assert code in (0, 128 + signal.SIGTERM)  # a graceful stop
    _, alive = await anyio.to_thread.run_sync(lambda: psutil.wait_procs(children, timeout=WAIT_S))
    assert alive == []  # it stopped its processes on the way out


# -- the supervisor sees a backlog -------------------------------------------------------------

INTERVAL_S, PROGRESS_S = 0.1, 5.0

GATED = f"""
[node]
stop_grace_s = {GRACE_S}

[supervision]
interval_s = {INTERVAL_S}
heartbeat_timeout_s = 2
progress_timeout_s = {PROGRESS_S}

[restart]
backoff_base_s = 0.05
backoff_max_s = 0.2

[[workers]]
name = "w-gate"
actors = [
  {{ name = "gate", class = "troupe.actors.demo.actors:Gate" }},
  {{ name = "echo", class = "troupe.actors.demo.actors:Echo" }},
]
"""


async def test_a_worker_whose_messages_wait_unhandled_is_killed_as_hung_and_restarted(
    troupe_cluster: Any,
) -> None:
    """The gate's handler awaits an event nobody sets, two messages queue behind it, and the
    echo of the same worker finishes its last message: the worker reports idle while its loop
    and beats go on. Messages wait and none is handled: it is hung, killed, restarted."""
    cluster: Cluster = troupe_cluster(GATED, "hb")
    before = await cluster.worker("w-gate")
    async with cluster.client() as rt:
        for i in range(3):  # the first one blocks the gate, the others wait behind it
            await rt.ref("gate").tell("pass", i)

        # The gate's socket and the echo's are read independently: only once the gate holds its
        # first message is the echo's the last one the worker begins and ends.
        with anyio.fail_after(WAIT_S):  # a bounded poll of the worker's own counters
            while True:
                gate = Cluster.worker_in(await cluster.status(), "w-gate")["runtime"]["actors"]["gate"]
                if gate["busy"] and gate["mailbox_depth"] == 2:
                    break
                await anyio.sleep(0.02)
        assert await rt.ref("echo").ask("echo", "idle now", timeout=WAIT_S) == "idle now"
        status = await cluster.wait_for(lambda s: "w-gate" in s["supervision"]["kills"], timeout=WAIT_S)
    kill = status["supervision"]["kills"]["w-gate"]
    assert kill["reason"] == "no_progress" and kill["pid"] == before["pid"]
    assert kill["last_status"]["state"] == "idle" and kill["last_status"]["backlog"] == 2
    assert kill["silent_s"] >= PROGRESS_S  # how soon after: on a virtual clock, test_liveness.py

    def restarted(s: dict[str, Any]) -> bool:
        w = Cluster.worker_in(s, "w-gate")
        return w["state"] == "running" and w["pid"] != before["pid"]

    after = Cluster.worker_in(await cluster.wait_for(restarted, timeout=WAIT_S), "w-gate")
    assert after["restarts"] == 1 and after["exit"].startswith("no_progress")
    async with cluster.client() as rt:
        assert await rt.ref("echo").ask("pid", timeout=WAIT_S) == after["pid"]
        assert await rt.ref("gate").ask("passed", timeout=WAIT_S) == 0
