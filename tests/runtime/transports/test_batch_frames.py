"""The batch frame's format: what goes in comes out, in order, and a broken one is refused."""

from __future__ import annotations

import msgpack
import pytest

from troupe.runtime.errors import BadFrame
from troupe.runtime.wire.batch_frames import (
    BATCH_MARK,
    MAX_BATCH_BYTES,
    batch_frames,
    pack_batch,
    unpack_batch,
)
from troupe.runtime.wire.codec import Codec, Envelope, Kind


def _header(i: int, size: int = 10) -> bytes:
    env = Envelope(Kind.TELL, i, 0, "n/a", "sink", "hit", None, None, None, b"x" * size)
    return Codec().encode(env)[0]


def test_headers_come_out_as_they_went_in() -> None:
    headers = [_header(i) for i in range(1, 40)]
    frame = pack_batch(headers)
    assert frame[:1] == BATCH_MARK
    assert unpack_batch(frame) == headers


def test_no_header_starts_with_the_mark() -> None:
    """The mark is the one byte msgpack never writes: a header is never taken for a batch."""
    with pytest.raises(msgpack.FormatError):
        msgpack.unpackb(BATCH_MARK)
    assert _header(1)[:1] != BATCH_MARK


@pytest.mark.parametrize(
    "frame",
    [
        BATCH_MARK,  # no message at all
        BATCH_MARK + b"\x05\x00",  # a length cut short
        BATCH_MARK + b"\xff\x00\x00\x00abc",  # a length past the end
        pack_batch([b"abc"])[:-1],  # the last message cut short
        pack_batch([b"x" * 100] * (MAX_BATCH_BYTES // 100)),  # over the bound: no sender makes it
    ],
)
def test_a_broken_batch_is_refused_whole(frame: bytes) -> None:
    assert unpack_batch(frame) is None


def test_batches_keep_the_order_and_the_size_bound() -> None:
    headers = [_header(i, size=700) for i in range(1, 100)]
    frames = list(batch_frames(headers))
    assert len(frames) > 1
    out: list[bytes] = []
    for frame, count in frames:
        assert len(frame) <= MAX_BATCH_BYTES
        inner = unpack_batch(frame) if frame[:1] == BATCH_MARK else [frame]
        assert inner is not None and len(inner) == count
        out.extend(inner)
    assert out == headers


def test_a_lone_header_goes_as_it_is() -> None:
    header = _header(1)
    assert list(batch_frames([header])) == [(header, 1)]


def test_a_header_over_the_bound_goes_alone() -> None:
    big, small = _header(1, size=MAX_BATCH_BYTES), _header(2)
    assert list(batch_frames([small, big, small])) == [(small, 1), (big, 1), (small, 1)]


def test_the_codec_names_a_batch_it_was_handed() -> None:
    """A batch the transport could not take apart reaches the codec: the error says what it is."""
    with pytest.raises(BadFrame, match="batch frame"):
        Codec().decode([BATCH_MARK + b"\xff\x00\x00\x00abc"])
