"""ZmqTransport details that the runtime tests do not show."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from troupe.runtime.zmq_transport import ZmqTransport

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread policies are Linux's")


def _io_threads() -> set[int]:
    tasks = Path(f"/proc/{os.getpid()}/task")
    return {int(t.name) for t in tasks.iterdir() if (t / "comm").read_text().startswith("ZMQbg/IO")}


@pytest.mark.parametrize(("batch", "policy"), [(True, os.SCHED_BATCH), (False, os.SCHED_OTHER)])
def test_the_private_context_io_thread_runs_under_the_chosen_policy(batch: bool, policy: int) -> None:
    """SCHED_BATCH keeps a woken I/O thread from preempting the event loop; it can be turned off."""
    before = _io_threads()
    transport = ZmqTransport(batch_io_thread=batch)  # binding a socket starts the I/O thread
    try:
        new = _io_threads() - before
        assert new, "the transport's context started no I/O thread"
        assert {os.sched_getscheduler(tid) for tid in new} == {policy}
    finally:
        transport.close()
