"""A master with CURVE keys gates its own log stream as a node gates its: a subscriber with a key
of the cluster (a reader's is enough) gets the master's lines, one without keys or with a key
the cluster never authorised gets none."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq

from support.chaos import start_master
from troupe.runtime.log_publisher import log_socket
from troupe.runtime.security.keys import CurveKeys, generate_keys, load_keys
from troupe.runtime.security.process import install

pytestmark = pytest.mark.e2e

WAIT_S = 60.0  # a bound on waiting for another process, not on its speed


def _stranger(keys: Path, elsewhere: Path) -> CurveKeys:
    """A pair this cluster never authorised, presented to the cluster's server key."""
    generate_keys(elsewhere)
    stranger = load_keys(elsewhere)
    return CurveKeys(
        stranger.directory, "stranger", stranger.public, stranger.secret, load_keys(keys).public, {}
    )


def _subscriber(context: zmq.Context[Any], keys: CurveKeys | None, endpoint: str) -> zmq.Socket[Any]:
    """A SUB of the log stream presenting ``keys`` (None: none), connected to ``endpoint``."""
    install(keys)  # log_socket takes the process's keys, as `troupe logs tail` does
    sock = log_socket(context, zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    return sock


def test_a_keyed_master_s_log_stream_admits_only_the_cluster_s_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate_keys(keys)
    operator = load_keys(keys, None)
    install(operator)  # the test talks to the keyed master as its operator
    context: zmq.Context[Any] = zmq.Context()
    sockets: list[zmq.Socket[Any]] = []
    master = start_master(tmp_path / "master", extra=("--keys", str(keys)))
    try:
        endpoint = anyio.run(master.call, "status")["log_endpoint"]
        assert endpoint and endpoint.startswith("tcp://127.0.0.1:")
        reader = _subscriber(context, load_keys(keys, "reader"), endpoint)
        bare = _subscriber(context, None, endpoint)
        stranger = _subscriber(context, _stranger(keys, tmp_path / "elsewhere"), endpoint)
        sockets += [reader, bare, stranger]
        install(operator)
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + WAIT_S
        k = 0
        while not any(rec["event"] == "job_submitted" for rec in got):  # until the subscription took
            assert time.monotonic() < deadline, f"the reader got no job_submitted line within {WAIT_S}s"
            anyio.run(master.submit, f"curved-{k}", "nap", 1, {})  # the master logs it
            k += 1
            if reader.poll(300):
                while reader.poll(0):
                    frames = reader.recv_multipart()
                    assert frames[0] == b"master"
                    got.append(json.loads(frames[3]))
        assert bare.poll(200) == 0 and stranger.poll(0) == 0  # nothing, though the reader has had lines
    finally:
        for sock in sockets:
            sock.close(0)
        context.term()
        install(None)
        assert master.reap() == []
