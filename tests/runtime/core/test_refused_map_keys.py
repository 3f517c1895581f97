"""A map key the protocol refuses (None, a bool, a float: docs/PROTOCOL.md 6) that msgpack packs
all the same fails the ask it is in, or the ask it answers, at once, naming the key. The ask had
waited out its deadline for an AskTimeout ("the target may be busy"), and a pipeline stage that
returned one hung its run for ever: the receiver dropped the frame with nobody told."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from troupe import Actor, handles
from troupe.runtime import Runtime
from troupe.runtime.errors import BadFrame
from troupe.runtime.lowlevel import MemoryHub
from troupe.runtime.wire.codec import Codec, Kind

NODE = "n"
LONG_S = 600.0  # an ask's deadline the test never reaches: the error must come first
BOUND_S = 30.0


class Keys(Actor):
    @handles("answer_with")
    def answer_with(self, payload: Any) -> Any:
        return {payload: 1}

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload


async def _two_runtimes_ask(msg_type: str, payload: Any) -> Any:
    hub = MemoryHub()
    with anyio.fail_after(BOUND_S):
        async with (
            Runtime(NODE, "b", hub.transport(name="b")) as b,
            Runtime(NODE, "a", hub.transport(name="a")) as a,
        ):
            await b.spawn(Keys(), "keys")
            a.directory.learn(f"{NODE}/b/keys", b.cells["keys"].endpoint)
            return await a.ref(f"{NODE}/b/keys").ask(msg_type, payload, timeout=LONG_S)


@pytest.mark.parametrize("key", [None, True, 1.5], ids=repr)
async def test_a_reply_with_a_refused_key_fails_its_ask_at_once(key: Any) -> None:
    with pytest.raises(BadFrame, match=f"the reply could not be read: map key {key!r} of type"):
        await _two_runtimes_ask("answer_with", key)


async def test_an_ask_with_a_refused_key_is_answered_with_the_error_at_once() -> None:
    with pytest.raises(BadFrame, match="map key None of type NoneType refused"):
        await _two_runtimes_ask("echo", {None: 1})


async def test_good_keys_still_travel() -> None:
    assert await _two_runtimes_ask("echo", {"s": 1, 2: [3], b"b": None}) == {"s": 1, 2: [3], b"b": None}


def test_the_bad_frame_names_the_envelope_it_came_in() -> None:
    frames = Codec().encode_message(Kind.ASK, 7, "n/a/x", "n/b/keys", "echo", None, None, None, {None: 1})
    with pytest.raises(BadFrame) as refused:
        Codec().decode(frames)
    assert refused.value.envelope == (Kind.ASK, 7, 0, "n/b/keys")
    with pytest.raises(BadFrame) as garbage:
        Codec().decode([b"\x93\x01\x02"])
    assert garbage.value.envelope is None
