"""What the master's error answers give a peer that sent something wrong (any peer: these come
before any key is checked). A bad frame's answer carried the decoder's whole Python traceback
(700 to 1,700 characters of the server's file paths); a ``resolve`` of a 100 KB address sent it
back twice, in the message and the traceback; and a message of too many frames was told to
"raise the node option max_frames", which the master does not have.

Now an error that is not a handler's failure has a one-line traceback (``type: message``), a
peer's text is shown cut, and the advice names only what the master offers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgpack

from support.memory_master import MASTER, master_in_memory
from troupe.runtime.transports.base import MemoryTransport

BOUND_S = 30.0


class RawPeer:
    """A foreign client: it sends frames as given and reads the answer's payload as it is."""

    def __init__(self, transport: MemoryTransport) -> None:
        self.transport = transport
        self.got: list[list[Any]] = []
        self.arrived = anyio.Event()

    async def on_message(self, _route: Any, frames: list[Any]) -> None:
        self.got.append(frames)
        self.arrived.set()

    async def answer(self, frames: list[bytes]) -> dict[str, Any]:
        self.got.clear()
        self.arrived = anyio.Event()
        await self.transport.send(MASTER, frames)
        with anyio.fail_after(BOUND_S):
            await self.arrived.wait()
        [got] = self.got
        envelope = msgpack.unpackb(got[0], strict_map_key=False)
        assert envelope[1] == 4, envelope  # an ERROR
        payload: dict[str, Any] = envelope[10]
        return payload


@asynccontextmanager
async def master_and_peer(tmp_path: Path) -> AsyncIterator[RawPeer]:
    async with master_in_memory(tmp_path) as m, anyio.create_task_group() as tg:
        peer = RawPeer(m.hub.transport(name="peer"))
        await tg.start(peer.transport.serve, peer.on_message)
        yield peer
        tg.cancel_scope.cancel()


def _header(kind: int, msg_type: str, payload: Any, target: str = "") -> bytes:
    return msgpack.packb([1, kind, 1, 0, "evil/p", target, msg_type, None, None, None, payload])


def _one_line(payload: dict[str, Any]) -> None:
    assert payload["traceback"] == f"{payload['type']}: {payload['message']}", payload["traceback"]
    assert "File " not in payload["traceback"]


async def test_a_bad_frame_is_answered_with_its_reason_in_one_line(tmp_path: Path) -> None:
    async with master_and_peer(tmp_path) as peer:
        payload = await peer.answer([b"\x93garbage"])
    assert payload["code"] == "bad_frame"
    assert payload["message"].startswith("header is not a valid msgpack envelope")
    _one_line(payload)


async def test_a_resolve_of_a_huge_address_is_not_sent_back(tmp_path: Path) -> None:
    async with master_and_peer(tmp_path) as peer:
        unknown = await peer.answer([_header(5, "resolve", {"address": "x" * 100_000})])
        malformed = await peer.answer([_header(5, "resolve", {"address": "x/" * 50_000})])
    assert unknown["code"] == "unknown_actor" and malformed["code"] == "bad_request"
    for payload, sent in ((unknown, "x"), (malformed, "x/")):
        shown = payload["message"]
        assert sent * (150 // len(sent)) in shown and sent * (201 // len(sent)) not in shown, shown
        assert "..." in shown and len(shown) < 400, shown
        _one_line(payload)


async def test_too_many_frames_names_no_option_the_master_lacks(tmp_path: Path) -> None:
    async with master_and_peer(tmp_path) as peer:
        payload = await peer.answer([_header(2, "echo", None, "echo"), *([b""] * 5000)])
    assert payload["code"] == "message_too_large"
    assert payload["message"] == (
        "message of 5001 frames exceeds the limit of 1024; send fewer, larger arrays"
    )
    _one_line(payload)
