"""ZmqTransport details that the runtime tests do not show."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from troupe.runtime.security.auth import private_context

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


OUT_OF_FILES = """
import resource, sys, anyio
from troupe.runtime.errors import Unreachable
from troupe.runtime.transports.zmq import ZmqTransport

async def main() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (160, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    transport = ZmqTransport()
    try:
        for i in range(1000):
            transport.try_send(f"ipc://{sys.argv[1]}/peer-{i}", [b"x"])
    except Unreachable as exc:
        print(type(exc).__name__, exc, flush=True)
    finally:
        transport.close()

anyio.run(main)
"""


def test_a_process_out_of_file_descriptors_is_told_so_and_closes_cleanly(tmp_path: Path) -> None:
    """Connections past the file limit: a troupe error that says what to do, not ZeroMQ's own,
    and no half-made socket left to hang the context's end."""
    done = subprocess.run(
        [sys.executable, "-c", OUT_OF_FILES, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout.strip()
    assert said.startswith("Unreachable cannot ") and "raise its limit, ulimit -n" in said, said
