"""One actor in a process of its own, on a ZeroMQ runtime over loopback.

Two runtimes in one process share an event loop, so one never sends while the other reads:
races between a send and a read on each side need two processes. An actor that ends its
process (``sys.exit``) needs one too.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from troupe.runtime import Actor, Runtime
from troupe.runtime.transports.zmq import ZmqTransport

__all__ = ["actor_process"]


def _serve(cls: type[Actor], process: str, actor: str, endpoint_q: Any) -> None:
    async def main() -> None:
        async with Runtime("n", process, ZmqTransport("tcp://127.0.0.1:*")) as rt:
            await rt.spawn(cls, actor)
            endpoint_q.put(rt.cells[actor].endpoint)
            await anyio.sleep_forever()  # until SIGTERM, or the actor ends the process

    anyio.run(main, backend_options={"use_uvloop": True})


@contextmanager
def actor_process(
    cls: type[Actor], process: str, actor: str, timeout: float = 30.0
) -> Iterator[tuple[str, mp.process.BaseProcess]]:
    """Start a process whose runtime runs ``cls`` as ``n/PROCESS/ACTOR``; yield the actor's
    mailbox endpoint and the process. On the way out the process is terminated and reaped,
    killed if it does not end in time."""
    ctx = mp.get_context("spawn")
    endpoint_q = ctx.Queue()
    proc = ctx.Process(target=_serve, args=(cls, process, actor, endpoint_q), daemon=True)
    proc.start()
    try:
        yield endpoint_q.get(timeout=timeout), proc
    finally:
        if proc.is_alive():
            proc.terminate()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout)
        endpoint_q.close()
        endpoint_q.join_thread()
