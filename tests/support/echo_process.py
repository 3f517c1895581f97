"""An echo actor in a process of its own, for tests of traffic between two processes.

Two runtimes in one process share an event loop, so one never sends while the other reads:
races between a send and a read on each side need two processes.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from troupe.runtime import Actor, Runtime, handles
from troupe.runtime.transports.zmq import ZmqTransport

__all__ = ["Echoer", "echo_process"]


class Echoer(Actor):
    """Answers each ask with its payload, from the reader that read it (no async handler)."""

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload


def _serve(endpoint_q: Any, stop: Any) -> None:
    async def main() -> None:
        async with Runtime("n", "echo", ZmqTransport("tcp://127.0.0.1:*")) as rt:
            await rt.spawn(Echoer, "echoer")
            endpoint_q.put(rt.cells["echoer"].endpoint)
            await anyio.to_thread.run_sync(stop.wait)

    anyio.run(main, backend_options={"use_uvloop": True})


@contextmanager
def echo_process(timeout: float = 30.0) -> Iterator[str]:
    """Start the echo process; yield its echoer's mailbox endpoint; stop and reap it on the way
    out, killed if it does not stop in time."""
    ctx = mp.get_context("spawn")
    endpoint_q = ctx.Queue()
    stop = ctx.Event()
    proc = ctx.Process(target=_serve, args=(endpoint_q, stop), daemon=True)
    proc.start()
    try:
        yield endpoint_q.get(timeout=timeout)
    finally:
        stop.set()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout)
        endpoint_q.close()
        endpoint_q.join_thread()
