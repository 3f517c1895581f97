"""The handler signature documented in docs/WRITING_ACTORS.md: ``handler(self, payload)``,
with ``None`` when the message carries no payload."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from troupe import Actor, RemoteError, handles
from troupe.runtime import Runtime
from troupe.runtime.lowlevel import MemoryHub


class Probe(Actor):
    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.told = anyio.Event()

    @handles("get")
    def get(self, payload: Any) -> list[Any]:
        self.seen.append(payload)
        return list(self.seen)

    @handles("note")
    async def note(self, payload: Any) -> None:
        self.seen.append(payload)
        self.told.set()

    @handles("no_argument")
    def no_argument(self) -> int:  # the mistake the guide warns of
        return 1


async def test_an_ask_or_tell_without_payload_calls_the_handler_with_none() -> None:
    """ask("get") and tell("note") with no payload: the handler gets None; with one, the payload."""
    hub = MemoryHub()
    async with Runtime("n", "p", hub.transport(name="p"), drain_timeout=0.5) as rt:
        probe = Probe()
        ref = await rt.spawn(probe, "probe")
        assert await ref.ask("get") == [None]
        await ref.tell("note")
        with anyio.fail_after(5):
            await probe.told.wait()
        assert await ref.ask("get", {"frame": 1}) == [None, None, {"frame": 1}]


async def test_a_handler_that_takes_no_payload_fails_each_message_with_a_type_error() -> None:
    """The asker gets the TypeError as a RemoteError."""
    hub = MemoryHub()
    async with Runtime("n", "p", hub.transport(name="p"), drain_timeout=0.5) as rt:
        ref = await rt.spawn(Probe(), "probe")
        with pytest.raises(RemoteError) as caught:
            await ref.ask("no_argument")
        assert caught.value.remote_type == "builtins.TypeError"
