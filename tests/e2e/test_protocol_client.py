"""A client written from docs/PROTOCOL.md alone (pyzmq and msgpack, no troupe) against a real node.

Each test speaks the wire protocol as a foreign client would: DEALER sockets, the 11-field
envelope, ext 1 arrays with their buffer frames, control messages to the node and a worker.
"""

from __future__ import annotations

import ast
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from support.cluster import NodeProc, running_node

TELL, ASK, REPLY, ERROR, CONTROL = 1, 2, 3, 4, 5
TESTS_DIR = str(Path(__file__).resolve().parents[1])  # workers import support.protocol_probe

# Spawned workers: the torch-codec test is about what a worker's own actors import, and a worker
# forked from the node's template has whatever the template imported for every worker.
PROBE_CONFIG = """
[node]
fast_start = false

[[workers]]
name = "w-probe"
actors = [
  { name = "probe", class = "support.protocol_probe:ArrayProbe" },
  { name = "echo", class = "troupe.actors.demo.actors:Echo" },
]

[[workers]]
name = "w-torch"
actors = [{ name = "tprobe", class = "support.protocol_probe_torch:TensorProbe" }]
"""


class RawClient:
    """One DEALER per endpoint, as section 1 says; replies are matched by corr_id."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.socks: dict[str, zmq.Socket[bytes]] = {}
        self.ids = itertools.count(1)

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close(linger=0)
        self.ctx.term()

    def _sock(self, endpoint: str) -> zmq.Socket[bytes]:
        if endpoint not in self.socks:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            self.socks[endpoint] = sock
        return self.socks[endpoint]

    def send(self, endpoint: str, header: list[Any], buffers: list[bytes] | None = None) -> None:
        self._sock(endpoint).send_multipart([msgpack.packb(header, use_bin_type=True), *(buffers or [])])

    def send_raw(self, endpoint: str, frames: list[bytes]) -> None:
        self._sock(endpoint).send_multipart(frames)

    def receive(self, endpoint: str, timeout_s: float = 15.0) -> tuple[list[Any], list[bytes]]:
        sock = self._sock(endpoint)
        assert sock.poll(int(timeout_s * 1000)), f"no answer from {endpoint} within {timeout_s} s"
        frames = sock.recv_multipart()
        header = msgpack.unpackb(
            frames[0],
            raw=False,
            strict_map_key=False,
            ext_hook=lambda code, data: msgpack.ExtType(code, data),
        )
        assert len(header) == 11 and header[0] == 1, header
        return header, frames[1:]

    def request(
        self,
        endpoint: str,
        kind: int,
        target: str,
        msg_type: str,
        payload: Any,
        buffers: list[bytes] | None = None,
    ) -> tuple[int, Any, list[bytes]]:
        """Send an ASK or CONTROL and return (kind, payload, buffer frames) of its answer."""
        msg_id = next(self.ids)
        self.send(
            endpoint,
            [1, kind, msg_id, 0, "client/py", target, msg_type, time.time() + 30, None, None, payload],
            buffers,
        )
        header, rest = self.receive(endpoint)
        assert header[2] == 0 and header[3] == msg_id, header  # a reply names what it answers
        return header[1], header[10], rest

    def control(self, endpoint: str, msg_type: str, payload: Any = None) -> tuple[int, Any]:
        kind, payload, _ = self.request(endpoint, CONTROL, "", msg_type, payload)
        return kind, payload


def _nd(arr: np.ndarray, index: int = 0) -> msgpack.ExtType:
    return msgpack.ExtType(1, msgpack.packb([arr.dtype.str, list(arr.shape), index]))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", TESTS_DIR)
        with running_node(tmp_path_factory.mktemp("protocol"), PROBE_CONFIG) as proc:
            yield proc


@pytest.fixture
def client() -> Iterator[RawClient]:
    c = RawClient()
    try:
        yield c
    finally:
        c.close()


def _resolve(client: RawClient, node: NodeProc, address: str) -> str:
    kind, reply = client.control(node.endpoint, "resolve", {"address": address})
    assert kind == REPLY, reply
    return str(reply["endpoint"])


def _worker_endpoint(client: RawClient, node: NodeProc, name: str) -> str:
    kind, status = client.control(node.endpoint, "status")
    assert kind == REPLY
    return next(w["endpoint"] for w in status["workers"] if w["name"] == name)


# -- ids and frames ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [ASK, CONTROL])
def test_msg_id_zero_on_an_ask_or_control_is_a_bad_frame(
    client: RawClient, node: NodeProc, kind: int
) -> None:
    """msg_id 0 answers nothing (section 4): an ASK or CONTROL carrying it is refused as a bad
    frame, answered with corr_id 0; the receiver serves on."""
    endpoint = _resolve(client, node, "echo")
    target, msg_type = ("echo", "echo") if kind == ASK else ("", "ping")
    client.send(endpoint, [1, kind, 0, 0, "client/py", target, msg_type, None, None, None, "hi"])
    header, _ = client.receive(endpoint)
    assert (header[1], header[3], header[10]["code"]) == (ERROR, 0, "bad_frame")
    assert "msg_id" in header[10]["message"]
    assert client.request(endpoint, ASK, "echo", "echo", "still here")[:2] == (REPLY, "still here")


@pytest.mark.parametrize("key", [None, True, 1.5], ids=["nil", "bool", "float"])
def test_map_keys_other_than_str_int_bin_are_bad_frames(client: RawClient, node: NodeProc, key: Any) -> None:
    """A map key of another type than str, int or bin is a bad frame (section 6). The envelope
    around it is sound: the error answers the ask (its msg_id), so the asker fails at once."""
    endpoint = _resolve(client, node, "echo")
    client.send(endpoint, [1, ASK, 5, 0, "client/py", "echo", "echo", None, None, None, {"ok": {key: 1}}])
    header, _ = client.receive(endpoint)
    assert (header[1], header[3], header[10]["code"]) == (ERROR, 5, "bad_frame")
    assert "map key" in header[10]["message"]


def test_int_str_and_bin_keys_travel(client: RawClient, node: NodeProc) -> None:
    endpoint = _resolve(client, node, "echo")
    payload = {1: "one", "two": 2, b"three": [3], -4: {5: None}}
    assert client.request(endpoint, ASK, "echo", "echo", payload)[:2] == (REPLY, payload)


# -- arrays -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["<M8[ns]", "<M8[D]", "<m8[s]", ">m8[us]"])
def test_datetime64_and_timedelta64_arrays_round_trip(client: RawClient, node: NodeProc, dtype: str) -> None:
    """datetime64 and timedelta64 travel like any fixed-size dtype: dtype.str, raw buffer."""
    arr = np.arange(6, dtype=np.int64).astype(dtype).reshape(2, 3)
    endpoint = _resolve(client, node, "echo")
    kind, payload, buffers = client.request(endpoint, ASK, "echo", "echo", _nd(arr), [arr.tobytes()])
    assert kind == REPLY
    spec = msgpack.unpackb(payload.data, raw=False)
    back = np.frombuffer(buffers[spec[2]], dtype=spec[0]).reshape(spec[1])
    assert back.dtype == arr.dtype and np.array_equal(back, arr)


def test_received_arrays_are_read_only(client: RawClient, node: NodeProc) -> None:
    """A received array views its frame (section 6.1): read-only, and writing into it fails."""
    arr = np.arange(4, dtype="<f4")
    endpoint = _resolve(client, node, "probe")
    kind, info, _ = client.request(endpoint, ASK, "probe", "describe", _nd(arr), [arr.tobytes()])
    assert (kind, info["type"], info["writeable"]) == (REPLY, "ndarray", False)
    kind, error, _ = client.request(endpoint, ASK, "probe", "write", _nd(arr), [arr.tobytes()])
    assert (kind, error["code"]) == (ERROR, "remote_error")
    assert "read-only" in error["message"]


def test_torch_codec_is_loaded_at_start_only_where_actors_import_torch(
    client: RawClient, node: NodeProc
) -> None:
    """A worker whose actors imported torch has its codec before the first tensor; one whose
    actors did not is not made to import torch (spawned workers: fast_start is off here)."""
    plain = client.request(_resolve(client, node, "probe"), ASK, "probe", "codecs", None)[1]
    assert plain == {"torch_imported": False, "extensions": []}
    torch_worker = client.request(_resolve(client, node, "tprobe"), ASK, "tprobe", "codecs", None)[1]
    assert torch_worker == {"torch_imported": True, "extensions": ["torch"]}
    meta = msgpack.ExtType(2, msgpack.packb(["torch", ["float32", [3]], 0]))
    data = np.array([1, 2, 3], dtype="<f4").tobytes()
    kind, reply, _ = client.request(_resolve(client, node, "tprobe"), ASK, "tprobe", "tensor", meta, [data])
    assert (kind, reply) == (REPLY, {"is_tensor": True, "sum": 6.0})


# -- control messages ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expect"),
    [
        ("echo", "w-probe/echo"),
        ("w-probe/echo", "w-probe/echo"),
        ("t/w-probe/echo", "w-probe/echo"),
        ("node", "node"),
        ("t/node", "node"),
    ],
)
def test_resolve_accepts_the_documented_forms(
    client: RawClient, node: NodeProc, address: str, expect: str
) -> None:
    kind, reply = client.control(node.endpoint, "resolve", {"address": address})
    assert kind == REPLY, reply
    assert reply["address"] == f"t/{expect}"
    if expect == "node":
        assert reply["endpoint"] == node.endpoint
    else:
        assert reply["endpoint"].startswith("tcp://127.0.0.1:")


@pytest.mark.parametrize(
    ("address", "code"),
    [
        ("other/w-probe/echo", "unreachable"),
        ("node/echo", "unknown_actor"),
        ("nobody", "unknown_actor"),
        ("t/node/echo", "unknown_actor"),
        ("a/b/c/d", "bad_request"),
        ("a//b", "bad_request"),
    ],
)
def test_resolve_refuses_what_the_text_does_not_give(
    client: RawClient, node: NodeProc, address: str, code: str
) -> None:
    kind, error = client.control(node.endpoint, "resolve", {"address": address})
    assert (kind, error["code"]) == (ERROR, code), error


NODE_BAD = [
    ("register", "not a map", "payload"),
    ("register", {"endpoint": "tcp://127.0.0.1:1", "pid": 1, "actors": {}}, "process"),
    ("register", {"process": "w-probe", "endpoint": "tcp://127.0.0.1:1", "pid": "1", "actors": {}}, "pid"),
    (
        "register",
        {"process": "w-probe", "endpoint": "tcp://127.0.0.1:1", "pid": 1, "actors": {"a": 1}},
        "actors",
    ),
    ("actor_spawned", {"process": "w-probe", "endpoint": "tcp://127.0.0.1:1"}, "actor"),
    ("actor_spawned", {"process": "w-probe", "endpoint": "e", "actor": {"name": "x"}}, "actor.class"),
    ("resolve", {}, "address"),
    ("resolve", {"address": 7}, "address"),
    ("spawn_worker", {"name": 5}, "name"),
    ("spawn_worker", {"name": "w-new", "timeout_s": "soon"}, "timeout_s"),
    ("stop_worker", {}, "name"),
    ("stop_worker", [1], "payload"),
    ("chaos", {"target": "w-probe"}, "kind"),
    ("chaos", {"kind": "drop", "target": 3}, "target"),
    ("heal", {"target": ["w-probe"]}, "target"),
    ("worker_killed", {"worker": "w-probe", "pid": "12", "reason": "x"}, "pid"),
    ("supervisor_ready", {"endpoint": "tcp://127.0.0.1:1", "udp": "127.0.0.1:9"}, "udp"),
    # A process the node did not start: its supervisor would have killed pid 1's whole tree,
    # or every worker's heartbeats would have gone to the sender.
    ("register", {"process": "w-probe", "endpoint": "tcp://127.0.0.1:1", "pid": 1, "actors": {}}, "pid"),
    ("supervisor_ready", {"endpoint": "tcp://127.0.0.1:1", "udp": ["127.0.0.1", 9], "pid": 1}, "pid"),
    ("supervisor_ready", {"endpoint": "tcp://127.0.0.1:1", "udp": ["h", 9], "pid": 1}, "udp"),
    ("supervisor_ready", {"endpoint": "tcp://127.0.0.1:1", "udp": ["127.0.0.1", -1], "pid": 1}, "udp"),
]

WORKER_BAD = [
    ("directory_update", {"key": "t/w-x"}, "endpoint"),
    ("directory_update", {"key": "t/w-x", "endpoint": "e", "actors": ["a"]}, "actors"),
    ("spawn", {"name": "late"}, "class"),
    ("spawn", 3, "payload"),
    ("chaos", {"faults": "drop"}, "faults"),
    ("chaos", {"faults": [], "seed": "x"}, "seed"),
    ("heartbeat_to", {"addr": ["127.0.0.1"]}, "addr"),
    ("heartbeat_to", {}, "addr"),
    ("heartbeat_to", {"addr": ["127.0.0.1", -1]}, "addr"),
    ("heartbeat_to", {"addr": ["256.1.1.1", 99]}, "addr"),
]


@pytest.mark.parametrize(("msg_type", "payload", "field"), NODE_BAD, ids=[f"{t}-{f}" for t, _, f in NODE_BAD])
def test_malformed_node_control_payload_is_a_bad_request(
    client: RawClient, node: NodeProc, msg_type: str, payload: Any, field: str
) -> None:
    """A node control with a missing or mistyped field answers bad_request naming the field,
    never a handler's KeyError or TypeError; the node serves on."""
    kind, error = client.control(node.endpoint, msg_type, payload)
    assert (kind, error["code"]) == (ERROR, "bad_request"), error
    assert repr(msg_type) in error["message"] and field in error["message"], error["message"]
    assert client.control(node.endpoint, "ping")[0] == REPLY


def test_a_spoofed_register_leaves_the_worker_as_it_was(client: RawClient, node: NodeProc) -> None:
    """A register naming another process (here this test's own) is refused, and the worker's
    registration stands: its pid, its endpoint, and the supervision that watches it."""

    def probe() -> dict[str, Any]:
        kind, status = client.control(node.endpoint, "status")
        assert kind == REPLY
        return next(w for w in status["workers"] if w["name"] == "w-probe")

    before = probe()
    spoof = {"process": "w-probe", "endpoint": "tcp://127.0.0.1:1", "pid": os.getpid(), "actors": {}}
    kind, error = client.control(node.endpoint, "register", spoof)
    assert (kind, error["code"]) == (ERROR, "bad_request"), error
    after = probe()
    assert (after["pid"], after["endpoint"]) == (before["pid"], before["endpoint"])
    assert client.control(after["endpoint"], "ping")[0] == REPLY


@pytest.mark.parametrize(
    ("msg_type", "payload", "field"), WORKER_BAD, ids=[f"{t}-{f}" for t, _, f in WORKER_BAD]
)
def test_malformed_worker_control_payload_is_a_bad_request(
    client: RawClient, node: NodeProc, msg_type: str, payload: Any, field: str
) -> None:
    endpoint = _worker_endpoint(client, node, "w-probe")
    kind, error = client.control(endpoint, msg_type, payload)
    assert (kind, error["code"]) == (ERROR, "bad_request"), error
    assert repr(msg_type) in error["message"] and field in error["message"], error["message"]
    assert client.control(endpoint, "ping")[0] == REPLY


def test_status_reply_has_the_documented_keys(client: RawClient, node: NodeProc) -> None:
    kind, status = client.control(node.endpoint, "status")
    assert kind == REPLY
    assert {"node", "pid", "endpoint", "uptime_s", "rss_mib", "workers", "runtime", "supervision"} <= set(
        status
    )
    worker = next(w for w in status["workers"] if w["name"] == "w-probe")
    assert {
        "name",
        "kind",
        "state",
        "pid",
        "endpoint",
        "actors",
        "actor_endpoints",
        "incarnation",
        "restarts",
        "exit",
        "rss_mib",
        "runtime",
    } <= set(worker)
    assert {"address", "actors", "pending_asks", "bad_frames", "late_replies"} <= set(worker["runtime"])


def test_unknown_control_lists_every_documented_type(client: RawClient, node: NodeProc) -> None:
    """The node and worker control tables of docs/PROTOCOL.md section 10 are what they answer."""
    node_types = {
        "ping",
        "status",
        "register",
        "actor_spawned",
        "resolve",
        "spawn_worker",
        "stop_worker",
        "shutdown",
        "supervisor_ready",
        "worker_killed",
        "supervision",
        "chaos",
        "heal",
        "log_recent",
    }
    worker_types = {
        "ping",
        "status",
        "stop",
        "directory_update",
        "spawn",
        "chaos",
        "heal",
        "faults",
        "heartbeat_to",
    }
    for endpoint, documented in (
        (node.endpoint, node_types),
        (_worker_endpoint(client, node, "w-probe"), worker_types),
    ):
        kind, error = client.control(endpoint, "no_such_control")
        assert (kind, error["code"]) == (ERROR, "unknown_message_type")
        known = error["message"].split("known: ", 1)[1]
        assert set(ast.literal_eval(known)) == documented


def test_req_socket_message_is_a_bad_frame(client: RawClient, node: NodeProc) -> None:
    """REQ is not supported (section 1): its empty delimiter frame makes the message a bad frame,
    counted by the receiver; the answer goes back without a delimiter, which REQ discards."""
    endpoint = _worker_endpoint(client, node, "w-probe")
    before = client.control(endpoint, "status")[1]["bad_frames"]
    req = client.ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    try:
        req.connect(endpoint)
        req.send(msgpack.packb([1, CONTROL, 1, 0, "client/req", "", "ping", None, None, None, None]))
        deadline = time.monotonic() + 15
        while client.control(endpoint, "status")[1]["bad_frames"] == before:  # bounded poll
            assert time.monotonic() < deadline, "the REQ message was not counted as a bad frame"
            time.sleep(0.05)
    finally:
        req.close(linger=0)
