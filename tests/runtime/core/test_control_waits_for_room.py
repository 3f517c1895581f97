"""A control message whose connection cannot take it at once waits for room until its deadline.

ZeroMQ refuses a send without waiting when no connection can take the message: the peer's queue
is at its high-water mark, or no connection is up at that moment (after a refused CURVE
handshake, until the next try). Such a control is the same as one with no reply: it waits, and
fails with AskTimeout at its deadline, never with a "mailbox full" that nothing was sent to.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from troupe.runtime import AskTimeout
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import MailboxFull
from troupe.runtime.transports.base import MemoryHub, MemoryTransport

BOUND = 10.0


class NoRoomAtFirst(MemoryTransport):
    """Refuses a non-blocking send ``refusals`` times, as a socket with no connection up would;
    with ``room`` unset, a blocking send waits until it is set."""

    def __init__(self, hub: MemoryHub, address: str, refusals: int) -> None:
        super().__init__(hub, address, 1000)
        self.refusals = refusals
        self.room = anyio.Event()
        self.waited = 0

    async def send(self, address: str, frames: list[Any], *, block: bool = True) -> None:
        if not block and self.refusals:
            self.refusals -= 1
            raise MailboxFull(f"the mailbox of {address} is full")
        if block:
            self.waited += 1
            await self.room.wait()
        await super().send(address, frames, block=block)


def _client(hub: MemoryHub, refusals: int) -> NoRoomAtFirst:
    t = NoRoomAtFirst(hub, "mem://client", refusals)
    hub.transports[t.address] = t
    return t


async def test_a_control_refused_at_once_is_sent_when_room_comes_and_answered() -> None:
    hub = MemoryHub()
    client = _client(hub, refusals=1)
    with anyio.fail_after(BOUND):
        async with (
            Runtime("n", "server", hub.transport(name="server")) as server,
            Runtime("n", "client", client) as rt,
        ):

            async def hello(payload: Any) -> str:
                return f"hello {payload}"

            server.register_control("hello", hello)
            async with anyio.create_task_group() as tg:

                async def ask() -> None:
                    assert await rt.control("mem://server", "hello", "you", timeout=BOUND) == "hello you"

                tg.start_soon(ask)
                while not client.waited:  # it waits for room instead of failing
                    await anyio.sleep(0.01)
                client.room.set()
    assert client.waited == 1


async def test_a_control_that_never_finds_room_times_out_at_its_deadline() -> None:
    hub = MemoryHub()
    client = _client(hub, refusals=1)
    with anyio.fail_after(BOUND):
        async with Runtime("n", "server", hub.transport(name="server")), Runtime("n", "client", client) as rt:
            with pytest.raises(AskTimeout, match=r"within 0\.2s"):
                await rt.control("mem://server", "ping", timeout=0.2)
    assert client.waited == 1
