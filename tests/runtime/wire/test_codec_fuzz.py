"""Fuzzing the codec with hypothesis: whatever frames arrive, the decoder raises only troupe's
ProtocolError (never IndexError, KeyError, MemoryError, RecursionError...), stays within its
limits, and what it encodes it decodes back unchanged. Bounded to run in seconds."""

from __future__ import annotations

import math
import tracemalloc
from typing import Any

import msgpack
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from troupe.runtime.errors import MessageTooLarge, ProtocolError
from troupe.runtime.wire.codec import EXT_CUSTOM, EXT_NDARRAY, PROTOCOL_VERSION, Codec, Envelope, Kind

FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
LIMIT = 1 << 16  # the message limit of the fuzzed codec: small, so that going past it is easy
MAX_FRAMES = 16

ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)
scalars = st.none() | st.booleans() | ints | st.floats() | st.text(max_size=40) | st.binary(max_size=40)
keys = st.text(max_size=10) | st.integers(min_value=-(2**63), max_value=2**63 - 1)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=25,
)
arrays = hnp.arrays(
    dtype=hnp.scalar_dtypes() | hnp.integer_dtypes(endianness="=") | hnp.floating_dtypes(endianness="="),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
)
payloads = st.recursive(
    scalars | arrays,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def codec() -> Codec:
    return Codec(max_message_bytes=LIMIT, max_frames=MAX_FRAMES)


def decode_or_refuse(frames: list[Any]) -> Envelope | None:
    """Decode; a ProtocolError is the one allowed refusal, anything else fails the test."""
    try:
        return codec().decode(frames)
    except ProtocolError as exc:
        assert str(exc), "a refusal must say why"
        return None


def valid_frames(payload: Any) -> list[bytes]:
    env = Envelope(Kind.ASK, 7, 0, "n/p/a", "target", "work", 1.5, "trace", {"h": 1}, payload)
    return [bytes(memoryview(f)) for f in Codec().encode(env)]


def _pack(fields: list[Any]) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()  # bytes, so that NaN equals itself
        )
    if isinstance(a, tuple):
        a = list(a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_equal, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


# -- arbitrary input ------------------------------------------------------------------------


@FUZZ
@given(st.lists(st.binary(max_size=200), max_size=6))
@example([])
@example([b""])
@example([b"\xc1"])
@example([b"\xdd\xff\xff\xff\xff"])  # an array that declares 4 billion elements
@example([b"\xdb\xff\xff\xff\xff"])  # a str that declares 4 GiB
@example([b"\xc6\x7f\xff\xff\xff"])  # a bin that declares 2 GiB
@example([b"\x91" * 5000 + b"\xc0"])  # nesting deeper than any recursion limit
@example([b"\xc7\x05\x01\x93\xa3<i8\x90\x00"])  # an ndarray extension pointing at no frame
def test_random_frames_are_refused_with_a_protocol_error(frames: list[bytes]) -> None:
    decode_or_refuse(frames)


@FUZZ
@given(payloads, st.data())
def test_truncated_valid_messages_are_refused(payload: Any, data: st.DataObject) -> None:
    frames = valid_frames(payload)
    index = data.draw(st.integers(0, len(frames) - 1), label="frame")
    cut = data.draw(st.integers(0, max(0, len(frames[index]) - 1)), label="cut")
    frames[index] = frames[index][:cut]
    env = decode_or_refuse(frames)
    # Only a buffer frame cut to nothing may still decode (an empty array of that shape).
    assert env is None or index > 0


@FUZZ
@given(payloads, st.data())
def test_mutated_valid_messages_are_refused_or_decode(payload: Any, data: st.DataObject) -> None:
    frames = valid_frames(payload)
    index = data.draw(st.integers(0, len(frames) - 1), label="frame")
    frame = bytearray(frames[index])
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        if not frame:
            break
        pos = data.draw(st.integers(0, len(frame) - 1), label="position")
        frame[pos] = data.draw(st.integers(0, 255), label="byte")
    frames[index] = bytes(frame)
    frames.extend(data.draw(st.lists(st.binary(max_size=20), max_size=2), label="extra frames"))
    decode_or_refuse(frames)


@FUZZ
@given(
    version=ints | scalars,
    kind=ints | scalars,
    msg_id=ints | scalars,
    corr_id=ints | scalars,
    names=st.lists(scalars, min_size=3, max_size=3),
    deadline=scalars,
    trace=scalars,
    headers=values,
    payload=values,
    length=st.integers(0, 14),
)
@example(
    version=PROTOCOL_VERSION + 1, kind=2, msg_id=1, corr_id=0, names=["s", "t", "x"],
    deadline=None, trace=None, headers=None, payload=None, length=11,
)  # fmt: skip
def test_envelopes_of_wrong_fields_versions_and_lengths_are_refused_or_valid(
    version: Any,
    kind: Any,
    msg_id: Any,
    corr_id: Any,
    names: list[Any],
    deadline: Any,
    trace: Any,
    headers: Any,
    payload: Any,
    length: int,
) -> None:
    fields = [version, kind, msg_id, corr_id, *names, deadline, trace, headers, payload]
    fields = (fields * 2)[:length]
    env = decode_or_refuse([_pack(fields)])
    if env is not None:
        assert length == 11 and version == PROTOCOL_VERSION and env.kind in Kind


@FUZZ
@given(
    code=st.sampled_from([EXT_NDARRAY, EXT_CUSTOM, 0, 3, 127, -1]),
    spec=values,
    buffers=st.lists(st.binary(max_size=64), max_size=3),
)
@example(code=EXT_NDARRAY, spec=["<f8", [2**62, 2**62], 0], buffers=[b""])  # a huge declared shape
@example(code=EXT_NDARRAY, spec=["<f8", [-1], 0], buffers=[b""])
@example(code=EXT_NDARRAY, spec=["O", [1], 0], buffers=[b"\x00" * 8])
@example(code=EXT_NDARRAY, spec=[[["a", [["b", "<i4"]] * 3]] * 2, [1], 0], buffers=[b"\x00" * 24])
@example(code=EXT_NDARRAY, spec=["V99999999999", [1], 0], buffers=[b""])
@example(code=EXT_CUSTOM, spec=["no-such-ext", None, 0], buffers=[b"x"])
def test_extensions_with_any_body_are_refused_or_valid(code: int, spec: Any, buffers: list[bytes]) -> None:
    ext = msgpack.ExtType(code, msgpack.packb(spec, use_bin_type=True)) if code >= 0 else b"\xd4"
    header = _pack([PROTOCOL_VERSION, 1, 1, 0, "s", "t", "x", None, None, None, {"v": ext}])
    decode_or_refuse([header, *buffers])


# -- limits ---------------------------------------------------------------------------------


@FUZZ
@given(count=st.integers(MAX_FRAMES + 1, 4 * MAX_FRAMES), size=st.integers(0, 8))
def test_more_frames_than_the_limit_are_refused_before_decoding(count: int, size: int) -> None:
    header = _pack([PROTOCOL_VERSION, 1, 1, 0, "s", "t", "x", None, None, None, None])
    assert decode_or_refuse([header] + [b"\x00" * size] * (count - 1)) is None


@settings(max_examples=40, deadline=None, database=None)
@given(declared=st.integers(LIMIT, 2**32 - 1), kind=st.sampled_from([b"\xdb", b"\xc6", b"\xdd", b"\xdf"]))
def test_declared_lengths_never_allocate_beyond_the_limit(declared: int, kind: bytes) -> None:
    """A header that declares a huge str, bin, array or map costs the decoder no more than the
    bytes it really has (bounded by the limit): msgpack checks lengths against the input."""
    assert _decode_peak(kind, declared) < _decode_peak(kind, 1) + LIMIT


def _decode_peak(kind: bytes, declared: int) -> int:
    """The peak of memory allocated while decoding a header whose last field declares
    ``declared`` elements (or bytes) of ``kind`` and has 64 bytes of them."""
    ten = _pack([PROTOCOL_VERSION, 1, 1, 0, "s", "t", "x", None, None, None])
    assert ten[0] == 0x9A  # a fixarray of ten: made one of eleven, the last a huge declaration
    header = b"\x9b" + ten[1:] + kind + declared.to_bytes(4, "big") + b"\x00" * 64
    tracemalloc.start()
    try:
        decode_or_refuse([header])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@FUZZ
@given(st.lists(st.binary(max_size=LIMIT // 4), min_size=2, max_size=6))
def test_messages_over_the_size_limit_are_refused(frames: list[bytes]) -> None:
    env = decode_or_refuse(frames)
    if sum(map(len, frames)) > LIMIT:
        assert env is None


# -- round trips ----------------------------------------------------------------------------


@FUZZ
@given(payloads)
@example(np.zeros((0, 3), dtype=np.float32))
@example({"a": np.datetime64("2024-01-01", "ns"), "b": [np.timedelta64(5, "s")]})
@example(np.zeros(2, dtype=[("x", "<i4"), ("y", "<f8", (2,))]))
@example(float("nan"))
@example(2**64 - 1)
@example(-(2**63))
def test_encode_then_decode_gives_the_payload_back(payload: Any) -> None:
    env = Envelope(Kind.TELL, 1, 0, "a", "b", "t", payload=payload)
    frames = [bytes(memoryview(f)) for f in Codec().encode(env)]
    assert _equal(_normalized(payload), Codec().decode(frames).payload)


def _normalized(value: Any) -> Any:
    """What the wire makes of a value: tuples become lists, numpy scalars Python ones, 0-d
    datetime scalars 0-d arrays."""
    if isinstance(value, np.generic):
        return np.asarray(value) if value.dtype.kind in "mM" else value.item()
    if isinstance(value, (list, tuple)):
        return [_normalized(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items()}
    return value


@FUZZ
@given(count=st.integers(1, 3 * MAX_FRAMES))
def test_a_sender_refuses_a_message_over_its_frame_limit_and_a_receiver_takes_one_within(count: int) -> None:
    """The frame limit holds both ways: the encoder refuses what a receiver of the same limit
    would, and the receiver takes everything the encoder lets out."""
    env = Envelope(Kind.TELL, 1, 0, "a", "b", "t", payload=[np.zeros(2, np.uint8)] * count)
    try:
        frames = codec().encode(env)
    except MessageTooLarge as exc:
        assert count + 1 > MAX_FRAMES and "max_frames" in str(exc)
        return
    assert len(frames) == count + 1 <= MAX_FRAMES
    assert len(codec().decode([bytes(memoryview(f)) for f in frames]).payload) == count
