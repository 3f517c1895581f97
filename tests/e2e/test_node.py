"""A real node with worker processes on loopback: tell, ask, errors, backpressure, bad frames."""

from __future__ import annotations

import json
import signal

import anyio
import msgpack
import numpy as np
import psutil
import pytest
import zmq

from support.cluster import NodeProc, ctl
from troupe.runtime import (
    AskTimeout,
    MailboxFull,
    RemoteError,
    UnknownActor,
    UnknownMessageType,
)
from troupe.runtime.core.client import connect

pytestmark = pytest.mark.e2e


def test_ctl_ping_and_status(demo_node: NodeProc) -> None:
    """`troupe ctl ping` answers and `ctl status --json` lists every worker running with its actors."""
    ping = ctl("ctl", "ping", "--node", demo_node.endpoint)
    assert ping.returncode == 0, ping.stderr
    assert "answered" in ping.stdout
    status = json.loads(ctl("ctl", "status", "--json", "--node", demo_node.endpoint).stdout)
    workers = {w["name"]: w for w in status["workers"]}
    assert set(workers) == {"w-echo", "w-gate", "w-relay"}
    assert all(w["state"] == "running" for w in workers.values())
    assert set(workers["w-gate"]["runtime"]["actors"]) == {"gate", "opener"}
    table = ctl("ctl", "status", "--node", demo_node.endpoint)
    assert table.returncode == 0 and "w-echo" in table.stdout


def test_ctl_reports_unreachable_node_clearly() -> None:
    """With no node listening, ctl prints one clear error (no traceback) and exits 1."""
    out = ctl("ctl", "ping", "--node", "tcp://127.0.0.1:9", "--timeout", "0.5")
    assert out.returncode == 1
    assert "no node answers" in out.stderr and "Traceback" not in out.stderr


async def test_tell_ask_errors_and_timeouts(demo_node: NodeProc) -> None:
    """Asks cross processes, arrays arrive intact, and every failure mode raises its own error."""
    async with connect(demo_node.endpoint, demo_node.name) as rt:
        echo = rt.ref("echo")
        assert await echo.ask("echo", {"a": [1, 2]}) == {"a": [1, 2]}
        arr = np.random.default_rng(0).standard_normal((256, 1024))
        back = await echo.ask("echo", arr)
        assert np.array_equal(back, arr)
        assert await echo.ask("sum", arr) == pytest.approx(float(arr.sum()))
        with pytest.raises(RemoteError) as info:
            await echo.ask("fail", "x")
        assert info.value.remote_type == "builtins.ValueError"
        assert "asked to fail: x" in info.value.remote_message
        assert "def fail" in info.value.remote_traceback or "in fail" in info.value.remote_traceback
        with pytest.raises(UnknownMessageType):
            await echo.ask("no-such-type")
        with pytest.raises(UnknownActor):
            await rt.ref("w-echo/nobody").ask("echo", 1)
        with pytest.raises(AskTimeout):
            await echo.ask("sleep", 1.0, timeout=0.05)
        # the actor keeps serving after an error and a timeout
        assert await echo.ask("echo", 7) == 7
        assert await rt.ref("relay").ask("relay", "via relay") == "via relay"


async def test_backpressure_full_mailbox_loses_nothing(demo_node: NodeProc) -> None:
    """A closed gate fills its mailbox; block=False then raises MailboxFull, and every accepted message is
    handled."""
    payload = b"p" * 10_000
    async with connect(demo_node.endpoint, demo_node.name) as rt:
        gate = rt.ref("gate")
        accepted = 0
        with anyio.fail_after(60):
            with pytest.raises(MailboxFull):
                while accepted < 20_000:  # bounded: the pipes hold far fewer 10 KB messages
                    await gate.tell("pass", payload, block=False)
                    accepted += 1
        assert accepted < 20_000
        assert await rt.ref("opener").ask("open") is True
        with anyio.fail_after(60):
            while await gate.ask("passed") < accepted:  # each ask is a round trip: a bounded poll
                pass
        assert await gate.ask("passed") == accepted


async def test_flood_of_bad_frames_keeps_serving(demo_node: NodeProc) -> None:
    """Garbage from a raw pyzmq socket is answered with errors while good traffic flows and no process
    dies."""
    async with connect(demo_node.endpoint, demo_node.name) as rt:
        echo = rt.ref("echo")
        pid = await echo.ask("pid")
        endpoint = rt.directory.cached(f"{demo_node.name}/w-echo/echo")
        assert endpoint is not None
        node_status = await rt.control(demo_node.endpoint, "status")
        process_endpoint = next(w["endpoint"] for w in node_status["workers"] if w["name"] == "w-echo")
        ctx = zmq.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(endpoint)
        rng = np.random.default_rng(1)
        good_header = msgpack.packb([1, 1, 1, 0, "", "echo", "echo", None, None, None, 1])
        bad = [
            [b""],
            [good_header[:5]],
            [bytes(rng.integers(0, 256, 64, dtype=np.uint8))],
            [msgpack.packb([99, 1, 1, 0, "", "echo", "echo", None, None, None, 1])],
            [msgpack.packb({"not": "an array"})],
            [msgpack.packb([1, 2, 5, 0, "", "ghost", "echo", None, None, None, 1])],
            [msgpack.packb([1, 2, 6, 0, "", "echo", "nope", None, None, None, 1])],
            [good_header, b"unreferenced buffer"],
        ]
        try:
            sent = 0
            answered_good = 0
            with anyio.fail_after(120):
                for round_ in range(100):
                    for frames in bad:
                        raw.send_multipart(frames)
                        sent += 1
                    assert await echo.ask("echo", round_) == round_
                    answered_good += 1
                errors = 0
                while raw.poll(2000):  # the answers were sent long before: wait for the last
                    reply = msgpack.unpackb(raw.recv_multipart()[0])
                    assert reply[1] == 4  # ERROR
                    errors += 1
            assert answered_good == 100
            assert await echo.ask("pid") == pid
            status = await rt.control(process_endpoint, "status")
            # Every message is answered with an ERROR (the empty frame too, through the
            # connection) until this connection's bad frames outrun its allowance: the one
            # that does is not answered, and the connection is throttled (its messages dropped
            # unread), while the good asks of another connection go on.
            assert status["bad_frames"] + status["dropped_from_throttled"] >= 6 * 100
            assert status["throttles"] >= 1 and status["errors_suppressed"] >= status["throttles"]
            assert errors == sent - status["errors_suppressed"] - status["dropped_from_throttled"]
        finally:
            raw.close(0)
            ctx.term()


def test_sigterm_stops_node_and_workers_cleanly(demo_node: NodeProc) -> None:
    """SIGTERM makes the node stop its workers gracefully and exit 143, leaving no process behind."""
    children = demo_node.descendants()
    assert len(children) >= 3
    demo_node.proc.send_signal(signal.SIGTERM)
    assert demo_node.proc.wait(timeout=30) == 128 + signal.SIGTERM
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
