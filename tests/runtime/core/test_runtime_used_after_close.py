"""A runtime used after its ``async with`` ended (report ap 9) says so, as a usage error: its
refs' asks and tells said ``Unreachable: transport is closed`` (a ConnectionError, which a
caller's retry loop retries forever), and a second ``async with`` raised an ExceptionGroup of
``OSError: Bad file descriptor``. Under a loop that is not asyncio's (anyio's trio backend, report
ap 8) entering one says that troupe runs on asyncio, not "no running event loop"."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from troupe.runtime import Actor, handles
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.transports.base import MemoryHub, MemoryTransport

HANG_GUARD_S = 30  # a bound on a hang, never on speed
CLOSED = r"this runtime \(n/client\) was closed \(its 'async with connect\(\.\.\.\)' ended\); connect again"


class Echo(Actor):
    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload


async def test_asks_tells_and_a_second_entry_after_the_block_say_it_was_closed() -> None:
    with anyio.fail_after(HANG_GUARD_S):
        async with process_runtime("n", "server") as server:
            await server.spawn(Echo, "echo")
            client = process_runtime("n", "client")
            client.directory.learn("n/server/echo", server.address)
            async with client:
                ref = client.ref("n/server/echo")
                assert await ref.ask("echo", 1, timeout=HANG_GUARD_S) == 1
            fresh = client.ref("n/server/echo")  # not resolved yet
            with pytest.raises(RuntimeError, match=CLOSED):
                await ref.ask("echo", 2, timeout=HANG_GUARD_S)
            with pytest.raises(RuntimeError, match=CLOSED):
                await ref.tell("echo", 3)
            with pytest.raises(RuntimeError, match=CLOSED):
                await fresh.ask("echo", 4, timeout=HANG_GUARD_S)
            with pytest.raises(RuntimeError, match=CLOSED):
                async with client:
                    pass


def test_entered_outside_an_asyncio_loop_it_says_troupe_runs_on_asyncio() -> None:
    """What trio shows it (no asyncio loop runs); trio itself where it is installed."""
    runtime = process_runtime("n", "p", transport=MemoryTransport(MemoryHub(), "mem://p", 16))
    entering = runtime.__aenter__()
    with pytest.raises(RuntimeError, match=r"troupe runs on asyncio \(or uvloop\) only; .*backend='asyncio'"):
        entering.send(None)
    entering.close()


def test_under_anyio_s_trio_backend_connect_says_troupe_runs_on_asyncio() -> None:
    pytest.importorskip("trio")
    from troupe.runtime import connect

    async def main() -> None:
        async with connect("tcp://127.0.0.1:9"):
            pass

    with pytest.raises(RuntimeError, match=r"troupe runs on asyncio \(or uvloop\) only"):
        anyio.run(main, backend="trio")
