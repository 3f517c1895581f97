"""Input limits on a live node: a peer that floods an actor's mailbox with garbage, messages of
too many frames and messages over the size limit is throttled, the node logs it once per
interval rather than once per frame, and a good client asking the same actor meanwhile has
every ask answered.

The hostile peers are raw pyzmq DEALERs, as a foreign client would be.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import msgpack
import pytest
import zmq

from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import Cluster

pytestmark = pytest.mark.e2e

troupe_cluster = troupe_testing.troupe_cluster

ASK = 2
WAIT_S = 60.0  # bound of every wait: a loaded 2-core box may be slow, never wedged
LIMIT = 64 * 1024  # max_message_mb below, in bytes
MAX_FRAMES = 8
BURST = 5
FLOOD = 3000
GOOD_ASKS = 200
THROTTLE_EVENTS = {"bad_frame_dropped", "peer_throttled", "throttled_peer_dropping", "peer_released"}

LIMITED = f"""
[node]
max_message_mb = {LIMIT / 2**20}
max_frames = {MAX_FRAMES}
bad_frames_burst = {BURST}
bad_frames_per_s = 1.0
throttle_s = 600.0

[[workers]]
name = "w-echo"
actors = [{{ name = "echo", class = "troupe.actors.demo.actors:Echo" }}]
"""


def _header(msg_id: int, payload: Any = None) -> bytes:
    return msgpack.packb(
        [1, ASK, msg_id, 0, "hostile/py", "echo", "echo", time.time() + 60, None, None, payload]
    )


def _junk(i: int) -> list[bytes]:
    """Garbage, a message of too many frames, or one over the size limit, in turn."""
    kind = i % 3
    if kind == 0:
        return [b"\xc1 not msgpack"]
    if kind == 1:
        return [_header(i + 1)] + [b"x"] * MAX_FRAMES  # one frame more than the limit
    return [_header(i + 1), b"\x00" * (LIMIT // 2), b"\x00" * (LIMIT // 2)]  # frames under it, the sum over


@contextmanager
def _dealer(endpoint: str) -> Iterator[zmq.Socket[bytes]]:
    with zmq.Context() as ctx:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # queue the whole flood here: a send never waits
        sock.connect(endpoint)
        try:
            yield sock
        finally:
            sock.close(0)


async def _mailbox(cluster: Cluster) -> str:
    """The echo actor's own mailbox endpoint."""
    reply = await cluster.control("resolve", {"address": "echo"}, timeout=WAIT_S)
    return str(reply["endpoint"])


def _events(cluster: Cluster, endpoint: str) -> list[dict[str, Any]]:
    """The log lines of the cluster about bad frames and throttling at ``endpoint``."""
    found = []
    for path in cluster.log_dir.glob("*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") in THROTTLE_EVENTS and endpoint in str(event.get("peer", "")):
                found.append(event)
    return found


async def test_a_flooding_peer_is_throttled_and_logged_per_interval_while_good_asks_are_answered(
    troupe_cluster: Any,
) -> None:
    cluster: Cluster = troupe_cluster(LIMITED, "il")
    async with cluster.client() as rt:
        echo = rt.ref("echo")
        assert await echo.ask("echo", "warm", timeout=WAIT_S) == "warm"
        endpoint = await _mailbox(cluster)
        status = await cluster.status(timeout=WAIT_S)
        answers: list[Any] = []
        with _dealer(endpoint) as bad:
            started = threading.Event()

            def flood() -> None:
                started.set()
                for i in range(FLOOD):
                    bad.send_multipart(_junk(i))

            flooder = threading.Thread(target=flood, daemon=True)
            flooder.start()
            try:
                started.wait(WAIT_S)
                for i in range(GOOD_ASKS):  # asked while the flood arrives, on its own connection
                    answers.append(await echo.ask("echo", i, timeout=WAIT_S))
            finally:
                await anyio.to_thread.run_sync(flooder.join, WAIT_S)
            assert not flooder.is_alive()

            def worker_runtime(s: dict[str, Any]) -> dict[str, Any]:
                return dict(Cluster.worker_in(s, "w-echo")["runtime"])

            with anyio.fail_after(WAIT_S):  # a bounded poll: every junk message read
                while True:
                    runtime = worker_runtime(await cluster.status(timeout=WAIT_S))
                    if runtime["bad_frames"] + runtime["dropped_from_throttled"] >= FLOOD:
                        break
                    await anyio.sleep(0.05)
            assert answers == list(range(GOOD_ASKS))  # every good ask answered, in order
            assert await echo.ask("echo", "after", timeout=WAIT_S) == "after"

    # The flooder's first bad frames were answered, then it was throttled for the rest.
    assert runtime["throttles"] == 1 and runtime["throttled_peers"] == 1
    assert BURST <= runtime["bad_frames"] < BURST + 20  # a few refilled tokens at most
    assert runtime["bad_frames"] + runtime["dropped_from_throttled"] == FLOOD
    assert runtime["actors"]["echo"]["handled"] >= GOOD_ASKS + 1  # and the first
    worker = Cluster.worker_in(status, "w-echo")
    assert (await cluster.worker("w-echo"))["pid"] == worker["pid"]  # never restarted

    # One line per bad frame within the allowance, one when throttled, then one per interval.
    with anyio.fail_after(WAIT_S):
        while not any(e["event"] == "peer_throttled" for e in _events(cluster, endpoint)):
            await anyio.sleep(0.05)
    events = _events(cluster, endpoint)
    names = [e["event"] for e in events]
    assert names.count("peer_throttled") == 1
    assert names.count("bad_frame_dropped") == runtime["bad_frames"] - runtime["errors_suppressed"]
    assert len(events) < 40, names  # not one per frame: FLOOD frames were sent
    codes = {e.get("code") for e in events if e["event"] == "bad_frame_dropped"}
    assert codes <= {"bad_frame", "message_too_large"} and "message_too_large" in codes


async def test_a_frame_over_the_limit_costs_its_sender_the_connection_not_the_node(
    troupe_cluster: Any,
) -> None:
    """libzmq refuses a frame over the limit before Python reads it (MAXMSGSIZE): the sender's
    connection is dropped, nothing of it is delivered, and the actor serves everyone else."""
    cluster: Cluster = troupe_cluster(LIMITED, "ib")
    async with cluster.client() as rt:
        echo = rt.ref("echo")
        endpoint = await _mailbox(cluster)
        with _dealer(endpoint) as big:
            monitor = big.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            try:
                big.send_multipart([_header(1, "x" * (2 * LIMIT))])

                def disconnected() -> bool:
                    return bool(monitor.poll(int(WAIT_S * 1000)))

                assert await anyio.to_thread.run_sync(disconnected), "the node kept the connection"
            finally:
                big.disable_monitor()
                monitor.close(0)
            assert await echo.ask("echo", "still here", timeout=WAIT_S) == "still here"
            runtime = Cluster.worker_in(await cluster.status(timeout=WAIT_S), "w-echo")["runtime"]
    assert runtime["actors"]["echo"]["handled"] == 1  # the big ask never reached the actor
    assert runtime["bad_frames"] == 0
