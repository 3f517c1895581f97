"""The ask path written out inline (issue 14, the messaging floor): what it must still do.

The per-ask helpers of the runtime, codec and transport were unrolled for speed; these tests
pin what a user relies on along that path: the same wire bytes, no buffers leaking from one
message into the next, deadlines that still fire, answered asks that do not linger in memory,
an idle actor that never overtakes a message on its way in, and byte counters that still count.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from troupe.runtime.core.mailbox import Mailbox
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.errors import BadFrame, EncodeError, VersionMismatch
from troupe.runtime.wire.codec import K_ASK, K_TELL, Codec, Envelope, Kind

# -- codec -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [K_TELL, K_ASK])
def test_encode_message_writes_the_bytes_of_the_envelope(kind: Kind) -> None:
    codec = Codec()
    args = (7, "n/p/src", "sink", "echo", 1.7e9, "trace-1", {"credit": 3}, {"x": [1, 2]})
    frames = codec.encode_message(kind, *args)
    assert frames == codec.encode(Envelope(kind, args[0], 0, *args[1:]))


def test_encode_reply_writes_the_bytes_of_the_envelope() -> None:
    codec = Codec()
    frames = codec.encode_reply(42, "n/p", b"x" * 100)
    assert frames == codec.encode(Envelope(Kind.REPLY, 0, 42, "n/p", "", "", None, None, None, b"x" * 100))


def test_an_array_travels_in_its_own_frame_and_never_into_the_next_message() -> None:
    codec = Codec()
    arr = np.arange(6, dtype=np.int32)
    with_array = codec.encode_message(K_ASK, 1, "s", "t", "m", None, None, None, {"a": arr})
    plain = codec.encode_message(K_ASK, 2, "s", "t", "m", None, None, None, {"a": 1})
    reply = codec.encode_reply(3, "s", arr)
    assert len(with_array) == 2 and len(plain) == 1 and len(reply) == 2
    assert codec.decode(with_array).payload["a"].tolist() == arr.tolist()
    assert codec.decode(reply).payload.tolist() == arr.tolist()


def test_a_payload_that_cannot_be_encoded_leaves_the_codec_clean() -> None:
    codec = Codec()
    with pytest.raises(EncodeError, match="object"):
        codec.encode_message(K_ASK, 1, "s", "t", "m", None, None, None, [np.zeros(3), object()])
    # The array packed before the failure must not ride along with the next message.
    assert len(codec.encode_message(K_ASK, 2, "s", "t", "m", None, None, None, "ok")) == 1
    assert codec.decode(codec.encode_reply(2, "s", "ok")).payload == "ok"


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ([2, 2, 1, 0, "s", "t", "m", None, None, None, None], VersionMismatch, "version 2"),
        ([1, 9, 1, 0, "s", "t", "m", None, None, None, None], BadFrame, "unknown message kind 9"),
        ([1, 2, 0, 0, "s", "t", "m", None, None, None, None], BadFrame, "msg_id 0"),
        ([1, 2, 1, 0, "s", "t", "", None, None, None, None], BadFrame, "non-empty type"),
        ([1, 3, 0, True, "s", "", "", None, None, None, None], BadFrame, "non-negative integers"),
        ([1, 3, 0, 1, "s", "", "", "soon", None, None, None], BadFrame, "deadline"),
        ([1, 3, 0, 1, "s", "", "", None, None, [], None], BadFrame, "headers"),
    ],
)
def test_a_header_alone_is_validated_as_every_message_is(
    fields: list[Any], error: type[Exception], match: str
) -> None:
    import msgpack

    with pytest.raises(error, match=match):
        Codec().decode_fields([msgpack.packb(fields)])


# -- mailbox ---------------------------------------------------------------------------------


async def test_an_idle_consumer_is_not_parked_while_a_woken_putter_holds_a_slot() -> None:
    """A message handled at once must not overtake one whose putter was just given room."""
    box: Mailbox[int] = Mailbox(1)
    box.put_nowait(1)
    putter = asyncio.ensure_future(box.put(2))
    await asyncio.sleep(0)  # the putter waits for room
    consumer_got: list[int] = []

    async def consume() -> None:
        consumer_got.append(await box.get())
        consumer_got.append(await box.get())

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0)  # took 1, handed the slot to the putter, which has not run yet
    assert consumer_got == [1]
    assert not box.consumer_parked(), "the putter's item is on its way in"
    await asyncio.wait_for(putter, 5)
    await asyncio.wait_for(consumer, 5)
    assert consumer_got == [1, 2]
    assert not box.consumer_parked()


# -- transport byte counters -------------------------------------------------------------------


async def test_an_ask_and_its_reply_are_counted_in_wire_bytes() -> None:
    from troupe.cli.bench.actors import Sink

    async with process_runtime("n", "dst") as dst, process_runtime("n", "src") as src:
        await dst.spawn(Sink, "sink")
        ref = src.ref("n/dst/sink")
        ref.endpoint = dst.cells["sink"].endpoint
        assert await ref.ask("echo", b"warm", timeout=10) == b"warm"
        sent: list[int] = [0, 0]
        served: list[int] = [0, 0]
        src.transport.wire_bytes = sent  # type: ignore[attr-defined]
        dst.transport.wire_bytes = served  # type: ignore[attr-defined]
        assert await ref.ask("echo", b"x" * 100, timeout=10) == b"x" * 100
        assert sent[0] > 100 and sent[0] == served[1]  # the ask, one header frame
        # The reply, one header frame; the mailbox also sent the asker's routing identity.
        assert served[0] > sent[1] > 100
