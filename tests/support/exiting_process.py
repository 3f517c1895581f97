"""An actor whose handlers call ``sys.exit``, in a process of its own (the exit ends it)."""

from __future__ import annotations

import multiprocessing as mp
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio

from troupe.runtime import Actor, Runtime, handles
from troupe.runtime.transports.zmq import ZmqTransport

__all__ = ["Quitter", "quitter_process"]


class Quitter(Actor):
    """Exits its process from a handler: a synchronous one (run where the message was read)
    and an async one (run in the actor's task)."""

    @handles("exit_sync")
    def exit_sync(self, code: Any) -> None:
        sys.exit(code)

    @handles("exit_async")
    async def exit_async(self, code: Any) -> None:
        await anyio.lowlevel.checkpoint()
        sys.exit(code)


def _serve(endpoint_q: Any) -> None:
    async def main() -> None:
        async with Runtime("n", "quitter", ZmqTransport("tcp://127.0.0.1:*")) as rt:
            await rt.spawn(Quitter, "quitter")
            endpoint_q.put(rt.cells["quitter"].endpoint)
            await anyio.sleep_forever()

    anyio.run(main, backend_options={"use_uvloop": True})


@contextmanager
def quitter_process(timeout: float = 30.0) -> Iterator[tuple[str, mp.process.BaseProcess]]:
    """Start the process; yield its quitter's mailbox endpoint and the process; reap it on the
    way out, killed if it is still running."""
    ctx = mp.get_context("spawn")
    endpoint_q = ctx.Queue()
    proc = ctx.Process(target=_serve, args=(endpoint_q,), daemon=True)
    proc.start()
    try:
        yield endpoint_q.get(timeout=timeout), proc
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout)
        endpoint_q.close()
        endpoint_q.join_thread()
