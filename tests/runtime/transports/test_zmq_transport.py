"""ZmqTransport details that the runtime tests do not show."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import zmq

from troupe.runtime.transports.zmq_socket import private_context

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread policies are Linux's")


def _threads() -> set[int]:
    return {int(t.name) for t in Path(f"/proc/{os.getpid()}/task").iterdir()}


@pytest.mark.parametrize(("batch", "policy"), [(True, os.SCHED_BATCH), (False, os.SCHED_OTHER)])
def test_the_private_context_threads_run_under_the_chosen_policy(batch: bool, policy: int) -> None:
    """SCHED_BATCH keeps a woken I/O thread from preempting the event loop; it can be turned off."""
    before = _threads()
    ctx = private_context(batch)
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        # A message over TCP passes through the I/O thread: once it is through, that thread has
        # started, and a ZeroMQ thread sets its policy first thing when it starts.
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        b.send(b"ping")
        assert a.poll(5000), "no message through the context's I/O thread within 5 s"
        assert a.recv() == b"ping"
        new = {
            tid: (
                Path(f"/proc/{os.getpid()}/task/{tid}/comm").read_text().strip(),
                os.sched_getscheduler(tid),
            )
            for tid in _threads() - before
        }
        io = {name: pol for name, pol in new.values() if name.startswith("ZMQbg/IO")}
        assert io and set(io.values()) == {policy}, new
    finally:
        a.close(0)
        b.close(0)
        ctx.term()
