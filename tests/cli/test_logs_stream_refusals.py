"""`troupe logs tail --master` says a log stream that refuses its handshake (a node restarted
without this follower's key, or on a rotated pair): it followed such a stream in silence, the
node's lines gone without a word, while `ctl` with the same keys said why at once."""

from __future__ import annotations

import errno
from collections.abc import Iterator

import pytest
import zmq

from troupe.cli.log_stream import ClusterLogs
from troupe.cli.log_stream_refusals import StreamRefusals

N1_LOG, MASTER_LOG = "tcp://10.0.0.2:9001", "tcp://10.0.0.1:9002"


@pytest.fixture
def sub() -> Iterator[zmq.Socket[bytes]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = context.socket(zmq.SUB)
    try:
        yield sock
    finally:
        sock.close(linger=0)
        context.term()


def test_a_stream_that_refuses_the_follower_is_said_once_with_why(sub: zmq.Socket[bytes]) -> None:
    notes: list[str] = []
    logs = ClusterLogs("tcp://10.0.0.1:7480", frozenset(), lambda line, node: True, 0, notes.append)
    status = {
        "master": "m1",
        "log_endpoint": MASTER_LOG,
        "nodes": [{"node": "n1", "endpoint": "tcp://10.0.0.2:7470", "log_endpoint": N1_LOG}],
    }
    logs._connect(sub, status)  # type: ignore[arg-type]
    refusals = StreamRefusals(sub, notes.append, logs._stream_at)

    refusals.heard(N1_LOG, zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)  # its keys lack this follower's
    refusals.heard(N1_LOG, zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)  # ZeroMQ's retry: said once
    assert len(notes) == 1
    assert notes[0].startswith("node n1: its log stream refuses this follower (the process at ")
    assert "refused this process's CURVE key" in notes[0] and notes[0].endswith(
        "until its keys and these agree"
    )

    # Hung up on twice in a row: a server key not this follower's (or CURVE on one side only).
    refusals.heard(MASTER_LOG, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, errno.ECONNRESET)
    assert len(notes) == 1  # once is a peer that stopped mid-handshake
    refusals.heard(MASTER_LOG, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, errno.ECONNRESET)
    assert len(notes) == 2 and notes[1].startswith("the master (m1): its log stream refuses this follower")

    refusals.heard("tcp://10.0.0.9:1", zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)  # no stream followed there
    assert len(notes) == 2
