"""The wire codec: round trips of every kind and payload type, and every bad frame refused."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import numpy as np
import pytest
import torch

from troupe.runtime.errors import (
    BadFrame,
    EncodeError,
    MessageTooLarge,
    ProtocolError,
    VersionMismatch,
)
from troupe.runtime.wire.codec import PROTOCOL_VERSION, Codec, Envelope, Kind

EXT_NDARRAY = 1
EXT_CUSTOM = 2


def _wire(frames: list[Any]) -> list[bytes]:
    """What a socket delivers: every frame as bytes owned by the receiver."""
    return [bytes(f) for f in frames]


def _roundtrip(env: Envelope, codec: Codec | None = None) -> tuple[Envelope, list[bytes]]:
    codec = codec or Codec()
    frames = _wire(codec.encode(env))
    return codec.decode(frames), frames


def _tell(payload: Any = None, **fields: Any) -> Envelope:
    base: dict[str, Any] = {
        "kind": Kind.TELL,
        "msg_id": 7,
        "corr_id": 0,
        "sender": "n1/client",
        "target": "counter",
        "type": "add",
    }
    base.update(fields)
    return Envelope(**base, payload=payload)


def _header(**overrides: Any) -> list[Any]:
    """A valid header as a list of the 11 wire fields, with some replaced."""
    fields: dict[str, Any] = {
        "version": PROTOCOL_VERSION,
        "kind": 1,
        "msg_id": 1,
        "corr_id": 0,
        "sender": "a",
        "target": "b",
        "type": "t",
        "deadline": None,
        "trace": None,
        "headers": None,
        "payload": None,
    }
    fields.update(overrides)
    return list(fields.values())


def _pack(fields: Any) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def _nd(dtype: Any, shape: Any, index: Any) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_NDARRAY, _pack([dtype, shape, index]))


def _custom(name: Any, meta: Any, index: Any) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_CUSTOM, _pack([name, meta, index]))


def _base_address(buf: bytes) -> tuple[int, int]:
    arr = np.frombuffer(buf, dtype=np.uint8)
    return arr.ctypes.data, arr.nbytes


# -- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_round_trips_with_all_fields(kind: Kind) -> None:
    """An envelope of each kind comes back with every field equal."""
    env = Envelope(
        kind,
        12,
        11 if kind in (Kind.REPLY, Kind.ERROR) else 0,
        "n/p/a",
        "actor",
        "work" if kind is not Kind.REPLY else "",
        1.7e9 + 0.25,
        "trace-1",
        {"credits": 3, "hint": "x"},
        {"k": [1, 2]},
    )
    out, frames = _roundtrip(env)
    assert out == env
    assert out.kind is kind
    assert len(frames) == 1


@pytest.mark.parametrize(
    "payload",
    [
        None,
        True,
        False,
        0,
        -1,
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        1.5,
        -0.0,
        float("inf"),
        "",
        "héllo ✓",
        b"",
        b"\x00\xffraw",
        [],
        {},
        [1, "a", None, [2.5, {"x": b"y"}]],
        {"a": {"b": {"c": [True, None]}}, "": 1},
    ],
    ids=repr,
)
def test_plain_payloads_round_trip(payload: Any) -> None:
    """Every plain msgpack type, nested or not, comes back equal and of the same type."""
    out, frames = _roundtrip(_tell(payload))
    assert out.payload == payload
    assert type(out.payload) is type(payload)
    assert len(frames) == 1


def test_tuples_travel_as_lists() -> None:
    """Tuples (also nested) arrive as lists, since msgpack has one array type."""
    out, _ = _roundtrip(_tell({"t": (1, (2, 3)), "u": ()}))
    assert out.payload == {"t": [1, [2, 3]], "u": []}


def test_numpy_scalars_travel_as_python_numbers() -> None:
    """numpy scalars are sent as the matching msgpack number."""
    out, frames = _roundtrip(_tell([np.float32(1.5), np.int64(-3), np.bool_(True)]))
    assert out.payload == [1.5, -3, True]
    assert len(frames) == 1


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(6, dtype=np.float64),
        np.array([-128, 0, 127], dtype=np.int8),
        np.arange(24, dtype=np.uint16).reshape(2, 3, 4),
        np.array([2**62, -(2**62)], dtype=np.int64),
        np.array([True, False, True]),
        np.array([1 + 2j, -3j], dtype=np.complex64),
        np.array([0.5, 65504.0], dtype=np.float16),
        np.arange(5, dtype=">i4"),
        np.array(3.25),
        np.zeros((0,), dtype=np.float32),
        np.zeros((4, 0, 2), dtype=np.int32),
        np.array(["ab", "c"]),
        np.array(["2024-02-29T12:00:00.123456789", "NaT"], dtype="M8[ns]"),
        np.arange(6, dtype=np.int64).astype("m8[s]").reshape(2, 3),
        np.arange(3, dtype=np.int64).astype(">M8[D]"),
        np.array(np.datetime64("1970-01-02", "D")),
        np.zeros((0, 2), dtype="m8[us]"),
    ],
    ids=lambda a: f"{a.dtype.str}{list(a.shape)}",
)
def test_numpy_arrays_round_trip(arr: np.ndarray) -> None:
    """Arrays of many dtypes and shapes (0-d and empty too) keep dtype, shape and values."""
    out, frames = _roundtrip(_tell({"x": arr}))
    got = out.payload["x"]
    assert isinstance(got, np.ndarray)
    assert got.dtype == arr.dtype and got.shape == arr.shape
    np.testing.assert_array_equal(got, arr)
    assert len(frames) == 2


@pytest.mark.parametrize(
    "dtype",
    [
        np.dtype([("x", "<f4"), ("y", "<i8")]),
        np.dtype([("pos", "<f8", (3,)), ("id", "<u2")]),
        np.dtype([("joint", [("q", "<f4"), ("dq", "<f4")]), ("ok", "|b1")]),
        np.dtype({"names": ["p", "q"], "formats": ["<i4", "<f8"], "offsets": [0, 8], "itemsize": 24}),
        np.dtype([(("a title", "t"), "<i4"), ("s", "<U3")]),
    ],
    ids=["flat", "subarray", "nested", "padded", "titled"],
)
def test_structured_arrays_keep_their_fields(dtype: np.dtype) -> None:
    """A structured dtype travels whole: names, formats, offsets and padding, as in .npy files."""
    arr = np.zeros(5, dtype=dtype)
    arr.view(np.uint8)[:] = np.arange(arr.nbytes, dtype=np.uint8) % 251
    out, frames = _roundtrip(_tell(arr))
    assert out.payload.dtype == dtype and out.payload.dtype.names == dtype.names
    assert out.payload.tobytes() == arr.tobytes()
    assert len(frames) == 2


def test_datetime_fields_of_a_structured_dtype_travel() -> None:
    """datetime64 and timedelta64 inside a structured dtype travel too (no buffer protocol for them)."""
    dtype = np.dtype([("t", "<M8[ms]"), ("dt", "<m8[ns]"), ("v", "<f4")])
    arr = np.zeros(3, dtype=dtype)
    arr["t"] = np.array(["2020-01-01", "2021-06-30", "NaT"], dtype="M8[ms]")
    arr["dt"] = np.arange(3).astype("m8[ns]")
    out, _ = _roundtrip(_tell(arr))
    assert out.payload.dtype == dtype and out.payload.tobytes() == arr.tobytes()


def test_datetime64_scalar_travels_as_a_0d_array_keeping_its_unit() -> None:
    """A datetime64 scalar as a number would lose its unit: it travels as a 0-d array."""
    out, frames = _roundtrip(
        _tell({"t": np.datetime64("2020-01-01T00:00", "m"), "dt": np.timedelta64(5, "h")})
    )
    assert out.payload["t"].shape == () and out.payload["t"].dtype == np.dtype("M8[m]")
    assert out.payload["t"] == np.datetime64("2020-01-01T00:00", "m")
    assert out.payload["dt"] == np.timedelta64(5, "h") and out.payload["dt"].dtype == np.dtype("m8[h]")
    assert len(frames) == 3


@pytest.mark.parametrize("arr", [np.arange(8, dtype=np.float32), np.zeros((2, 0)), np.array(7)], ids=repr)
def test_received_arrays_are_read_only(arr: np.ndarray) -> None:
    """A received array views its frame, even a writable one (zmq's), so it is read-only."""
    codec = Codec()
    frames = [bytearray(f) for f in codec.encode(_tell({"a": arr}))]
    got = codec.decode(frames).payload["a"]
    assert not got.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        got[...] = 1


def test_non_contiguous_array_is_sent_contiguous() -> None:
    """A strided view (a slice, a transpose) arrives as a contiguous copy with the same values."""
    base = np.arange(40, dtype=np.int32).reshape(5, 8)
    for view in (base[:, ::3], base.T, base[::-1]):
        assert not view.flags.c_contiguous
        out, frames = _roundtrip(_tell(view))
        np.testing.assert_array_equal(out.payload, view)
        assert len(frames[1]) == view.nbytes


def test_received_array_views_the_frame_without_copy() -> None:
    """A received array is a view of its buffer frame: no copy on the receive side."""
    arr = np.random.default_rng(0).random(131072)  # 1 MiB of float64
    out, frames = _roundtrip(_tell(arr))
    assert arr.nbytes == 1 << 20
    assert np.shares_memory(out.payload, np.frombuffer(frames[1], dtype=np.uint8))
    np.testing.assert_array_equal(out.payload, arr)


def test_sent_contiguous_array_is_not_copied_into_the_frame() -> None:
    """The buffer frame of a contiguous array is a view of the array itself."""
    arr = np.arange(1000, dtype=np.float32)
    frames = Codec().encode(_tell(arr))
    assert np.shares_memory(np.asarray(frames[1]), arr)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16),
        torch.tensor([[2**40, -1]], dtype=torch.int64),
        torch.zeros((0, 3), dtype=torch.float16),
        torch.arange(6, dtype=torch.uint8),
    ],
    ids=lambda t: f"{t.dtype}{list(t.shape)}",
)
def test_torch_tensors_round_trip(tensor: torch.Tensor) -> None:
    """Tensors (bfloat16, int64 and empty too) keep dtype, shape and values."""
    out, frames = _roundtrip(_tell({"t": tensor}))
    got = out.payload["t"]
    assert isinstance(got, torch.Tensor)
    assert got.dtype == tensor.dtype and got.shape == tensor.shape
    assert torch.equal(got, tensor)
    assert len(frames) == 2


def test_received_tensor_views_the_frame_without_copy() -> None:
    """A received tensor's memory lies inside its buffer frame."""
    tensor = torch.arange(4096, dtype=torch.float32).to(torch.bfloat16)
    out, frames = _roundtrip(_tell(tensor))
    start, size = _base_address(frames[1])
    assert start <= out.payload.data_ptr() < start + size
    assert torch.equal(out.payload, tensor)


def test_torch_extension_header_names_dtype_and_shape() -> None:
    """A tensor is referenced by extension 2 as ["torch", [dtype name, shape], index]."""
    frames = Codec().encode(_tell(torch.zeros((2, 3), dtype=torch.bfloat16)))
    payload = msgpack.unpackb(frames[0], raw=False)[10]
    assert payload.code == EXT_CUSTOM
    assert msgpack.unpackb(payload.data, raw=False) == ["torch", ["bfloat16", [2, 3]], 0]
    assert memoryview(frames[1]).nbytes == 12


def test_mixed_arrays_in_nested_structures() -> None:
    """Several arrays and tensors nested in lists and maps each get a frame, in header order."""
    a = np.arange(3, dtype=np.int16)
    b = np.ones((2, 2), dtype=np.float64)
    t = torch.tensor([7, 8], dtype=torch.int64)
    payload = {"first": [a, {"deep": (b, "s")}], "tensor": t, "n": 1}
    out, frames = _roundtrip(_tell(payload))
    assert len(frames) == 4
    got = out.payload
    np.testing.assert_array_equal(got["first"][0], a)
    np.testing.assert_array_equal(got["first"][1]["deep"][0], b)
    assert got["first"][1]["deep"][1] == "s"
    assert torch.equal(got["tensor"], t)
    assert got["n"] == 1


@pytest.mark.parametrize(
    "payload",
    [None, b"x" * 100, {"arr": np.arange(6.0), "empty": [np.zeros(0), np.zeros(0)]}, torch.ones(3)],
    ids=["none", "bytes", "arrays", "tensor"],
)
def test_encode_reply_gives_the_frames_of_the_reply_envelope(payload: Any) -> None:
    """The reply shortcut writes what encoding the REPLY envelope writes, buffers included."""
    codec = Codec()
    env = Envelope(Kind.REPLY, 0, 42, "n/p", "", "", None, None, None, payload)
    assert [bytes(f) for f in codec.encode_reply(42, "n/p", payload)] == [bytes(f) for f in codec.encode(env)]


def test_encode_reply_of_an_unencodable_result_raises_encode_error() -> None:
    codec = Codec()
    with pytest.raises(EncodeError, match="no wire encoding for object"):
        codec.encode_reply(1, "n/p", {"x": object()})
    assert codec.decode(codec.encode_reply(2, "n/p", "fine")).payload == "fine"  # the packer recovered


def test_arrays_in_headers_travel_too() -> None:
    """Buffer references work in the headers field as well as in the payload."""
    arr = np.arange(4, dtype=np.uint32)
    out, frames = _roundtrip(_tell(arr * 2, headers={"mask": arr}))
    np.testing.assert_array_equal(out.headers["mask"], arr)
    np.testing.assert_array_equal(out.payload, arr * 2)
    assert len(frames) == 3


def test_tell_of_n_1_has_the_documented_bytes() -> None:
    """The worked example in docs/PROTOCOL.md is exactly what the codec produces."""
    frames = Codec().encode(_tell({"n": 1}))
    assert frames == [
        bytes.fromhex(
            "9b 01 01 07 00 a9 6e 31 2f 63 6c 69 65 6e 74 a7 63 6f 75 6e 74 65 72"
            " a3 61 64 64 c0 c0 c0 81 a1 6e 01"
        )
    ]


# -- bad frames -----------------------------------------------------------------------------


def test_empty_frame_list_is_bad() -> None:
    """A message with no header frame is refused."""
    with pytest.raises(BadFrame, match="empty message"):
        Codec().decode([])


def test_truncated_header_is_bad() -> None:
    """A header cut anywhere in the middle is refused."""
    header = _wire(Codec().encode(_tell({"n": 1, "s": "text"}, trace="tr")))[0]
    codec = Codec()
    for cut in range(1, len(header)):
        with pytest.raises(BadFrame):
            codec.decode([header[:cut]])


@pytest.mark.parametrize("seed", range(200))
def test_random_garbage_is_refused(seed: int) -> None:
    """Random bytes in the header raise a protocol error, never anything else."""
    rng = random.Random(seed)
    data = rng.randbytes(rng.randint(1, 64))
    if seed % 2:
        data = b"\x9b" + data  # a fixarray of 11: gets past the first check more often
    with pytest.raises((BadFrame, VersionMismatch)):
        Codec().decode([data])


@pytest.mark.parametrize("seed", range(100))
def test_mutated_valid_header_is_decoded_or_refused(seed: int) -> None:
    """Flipping bytes of a valid message gives an envelope or a ProtocolError, nothing else."""
    rng = random.Random(seed)
    frames = _wire(Codec().encode(_tell({"a": np.arange(3, dtype=np.int32)}, trace="t")))
    header = bytearray(frames[0])
    for _ in range(rng.randint(1, 3)):
        header[rng.randrange(len(header))] = rng.randrange(256)
    try:
        env = Codec().decode([bytes(header), frames[1]])
    except ProtocolError:
        return
    assert isinstance(env, Envelope)


@pytest.mark.parametrize("value", [{"a": 1}, 5, "text", None, b"bin"], ids=repr)
def test_header_that_is_not_an_array_is_bad(value: Any) -> None:
    """A header holding a msgpack value other than an array is refused."""
    with pytest.raises(BadFrame, match="must be a msgpack array"):
        Codec().decode([_pack(value)])


@pytest.mark.parametrize("count", [0, 1, 10, 12])
def test_wrong_field_count_is_bad(count: int) -> None:
    """An envelope of version 1 without exactly 11 fields is refused."""
    fields = (_header() + [None] * 5)[:count]
    with pytest.raises(BadFrame):
        Codec().decode([_pack(fields)])


@pytest.mark.parametrize(
    "fields",
    [_header(version=2), _header(version=0), _header(version="1"), [2, 1, 1], [*_header(), 2]],
    ids=["v2", "v0", "v-str", "v2-short", "v1-long"],
)
def test_wrong_protocol_version(fields: list[Any]) -> None:
    """Another version raises VersionMismatch, whatever its field count; v1 of wrong length is bad."""
    expected = BadFrame if fields[0] == PROTOCOL_VERSION else VersionMismatch
    with pytest.raises(expected):
        Codec().decode([_pack(fields)])


def test_version_mismatch_is_not_a_bad_frame() -> None:
    """VersionMismatch is its own protocol error, so a peer can tell it apart."""
    with pytest.raises(VersionMismatch) as info:
        Codec().decode([_pack(_header(version=2))])
    assert not isinstance(info.value, BadFrame)
    assert info.value.code == "version_mismatch"


@pytest.mark.parametrize("kind", [0, 6, -1, "tell", None, 1.0], ids=repr)
def test_bad_kind(kind: Any) -> None:
    """A kind outside 1..5 (or not an integer) is refused."""
    with pytest.raises(BadFrame, match="kind"):
        Codec().decode([_pack(_header(kind=kind))])


@pytest.mark.parametrize(
    "overrides",
    [{"msg_id": -1}, {"corr_id": -5}, {"msg_id": 1.5}, {"corr_id": "3"}, {"msg_id": None}],
    ids=repr,
)
def test_bad_ids(overrides: dict[str, Any]) -> None:
    """Negative or non-integer msg_id and corr_id are refused."""
    with pytest.raises(BadFrame, match="msg_id and corr_id"):
        Codec().decode([_pack(_header(**overrides))])


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"msg_id": True}, BadFrame),
        ({"corr_id": False}, BadFrame),
        ({"kind": True}, BadFrame),
        ({"version": True}, VersionMismatch),
    ],
    ids=["bool-msg-id", "bool-corr-id", "bool-kind", "bool-version"],
)
def test_booleans_are_not_integers(overrides: dict[str, Any], error: type[ProtocolError]) -> None:
    """A msgpack boolean where the protocol wants an integer is refused (True is not 1)."""
    with pytest.raises(error):
        Codec().decode([_pack(_header(**overrides))])


@pytest.mark.parametrize("field", ["sender", "target", "type"])
@pytest.mark.parametrize("value", [1, None, b"bytes", ["a"]], ids=repr)
def test_address_fields_must_be_strings(field: str, value: Any) -> None:
    """sender, target and type must be msgpack str (bin is not accepted)."""
    with pytest.raises(BadFrame, match="must be strings"):
        Codec().decode([_pack(_header(**{field: value}))])


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"deadline": "soon"}, "deadline"),
        ({"deadline": [1]}, "deadline"),
        ({"deadline": True}, "deadline"),
        ({"trace": 5}, "trace"),
        ({"trace": b"t"}, "trace"),
        ({"headers": []}, "headers"),
        ({"headers": "x"}, "headers"),
    ],
    ids=repr,
)
def test_optional_fields_have_types(overrides: dict[str, Any], match: str) -> None:
    """deadline is a number or nil, trace a str or nil, headers a map or nil."""
    with pytest.raises(BadFrame, match=match):
        Codec().decode([_pack(_header(**overrides))])


def test_integer_deadline_is_accepted() -> None:
    """A deadline may be a msgpack integer as well as a float."""
    env = Codec().decode([_pack(_header(deadline=1_700_000_000))])
    assert env.deadline == 1_700_000_000


@pytest.mark.parametrize("kind", [Kind.TELL, Kind.ASK])
def test_empty_type_on_tell_or_ask_is_bad(kind: Kind) -> None:
    """A tell or an ask must name the handler to run."""
    with pytest.raises(BadFrame, match="non-empty type"):
        Codec().decode([_pack(_header(kind=int(kind), type=""))])


@pytest.mark.parametrize("kind", [Kind.REPLY, Kind.ERROR])
def test_empty_type_on_reply_is_fine(kind: Kind) -> None:
    """Replies and errors carry an empty type."""
    env = Codec().decode([_pack(_header(kind=int(kind), type="", corr_id=4))])
    assert env.kind is kind and env.corr_id == 4


@pytest.mark.parametrize("kind", [Kind.ASK, Kind.CONTROL])
def test_msg_id_zero_on_ask_or_control_is_bad(kind: Kind) -> None:
    """msg_id 0 answers nothing: an ask or control message with it could not be answered."""
    with pytest.raises(BadFrame, match="msg_id 0"):
        Codec().decode([_pack(_header(kind=int(kind), msg_id=0))])


@pytest.mark.parametrize("kind", [Kind.TELL, Kind.REPLY, Kind.ERROR])
def test_msg_id_zero_is_fine_where_nothing_answers(kind: Kind) -> None:
    env = Codec().decode([_pack(_header(kind=int(kind), msg_id=0, corr_id=3))])
    assert env.kind is kind and env.msg_id == 0


@pytest.mark.parametrize("key", [None, True, False, 1.5], ids=repr)
@pytest.mark.parametrize("where", ["payload", "nested", "headers"])
def test_map_keys_other_than_str_int_bin_are_bad(key: Any, where: str) -> None:
    """Only str, int and bin map keys are accepted (docs/PROTOCOL.md 6), at any depth."""
    bad = {"ok": 1, key: 2}
    fields = {
        "payload": {"headers": None, "payload": bad},
        "nested": {"headers": None, "payload": [{"a": bad}]},
        "headers": {"headers": bad, "payload": None},
    }[where]
    with pytest.raises(BadFrame, match="map key"):
        Codec().decode([_pack(_header(**fields))])


def test_bad_map_key_beside_an_array_is_bad_and_good_int_keys_keep_their_arrays() -> None:
    """The key check re-reads the header; buffer frames are claimed once, whatever the pass."""
    arr = np.arange(3, dtype="<i2")
    # "a" and its array come before the int key: the first pass claims the frame, then fails.
    ok = Codec().decode([_pack(_header(payload={"a": _nd("<i2", [3], 0), 2: "x"})), arr.tobytes()])
    np.testing.assert_array_equal(ok.payload["a"], arr)
    assert ok.payload[2] == "x"
    with pytest.raises(BadFrame, match="map key"):
        Codec().decode([_pack(_header(payload={1.5: _nd("<i2", [3], 0)})), arr.tobytes()])


def test_bin_map_keys_round_trip() -> None:
    out, _ = _roundtrip(_tell({b"k": 1, "s": {b"": [2]}}))
    assert out.payload == {b"k": 1, "s": {b"": [2]}}


def test_integer_map_keys_round_trip() -> None:
    """Maps may have integer keys as well as string keys, in payload and headers."""
    payload = {1: "one", -2: [3], "s": {0: None}}
    out, _ = _roundtrip(_tell(payload, headers={7: "h"}))
    assert out.payload == payload
    assert out.headers == {7: "h"}


def test_unhashable_map_key_is_bad() -> None:
    """A map key that is itself an array cannot be a key and is refused."""
    header = bytearray(_pack(_header(payload={"k": 1})))
    # replace the fixstr key "k" (a1 6b) by a one-element array [1] (91 01)
    at = header.index(b"\x81\xa1k") + 1
    header[at : at + 2] = b"\x91\x01"
    with pytest.raises(BadFrame):
        Codec().decode([bytes(header)])


@pytest.mark.parametrize(
    ("payload", "buffers", "match"),
    [
        (_nd("<f4", [2], 1), [b"\0" * 8], "points at no frame"),
        (_nd("<f4", [2], -1), [b"\0" * 8], "points at no frame"),
        (_nd([["x"]], [1], 0), [b"\0" * 8], "fields"),
        (_nd([["x", "<f4", [1], 9]], [1], 0), [b"\0" * 8], "fields"),
        (_nd(["x", "<f4"], [1], 0), [b"\0" * 8], "fields"),
        (_nd([["x", "<q7"]], [1], 0), [b"\0" * 8], "unknown dtype"),
        (_nd([[3, "<f4"]], [1], 0), [b"\0" * 4], "unknown dtype"),
        (_nd([["o", "|O"]], [1], 0), [b"\0" * 8], "object"),
        (_nd([["x", "<f4"], ["y", "<f4"]], [2], 0), [b"\0" * 8], "needs 16 bytes"),
        (_nd("<f4", [2], "0"), [b"\0" * 8], "points at no frame"),
        (_nd("<f4", [2], 0), [], "points at no frame"),
        ([_nd("<f4", [2], 0), _nd("<f4", [2], 0)], [b"\0" * 8], "referenced twice"),
        (None, [b"extra"], "buffer frames"),
        (_nd("<f4", [2], 0), [b"\0" * 8, b"extra"], "buffer frames"),
        (_nd("<f4", [3], 0), [b"\0" * 8], "needs 12 bytes"),
        (_nd("<f4", [], 0), [b""], "needs 4 bytes"),
        (_nd("|O", [1], 0), [b"\0" * 8], "object"),
        (_nd("<q7", [1], 0), [b"\0" * 8], "unknown dtype"),
        (_nd("<f4", [-1], 0), [b""], "shape"),
        (_nd("<f4", 2, 0), [b"\0" * 8], "shape"),
        (_nd("<f4", [2.0], 0), [b"\0" * 8], "shape"),
        (msgpack.ExtType(EXT_NDARRAY, _pack(["<f4", [2]])), [b"\0" * 8], "ndarray extension"),
        (msgpack.ExtType(EXT_NDARRAY, _pack({"dtype": "<f4"})), [b"\0" * 8], "ndarray extension"),
        (msgpack.ExtType(EXT_NDARRAY, b"\xc1"), [b"\0" * 8], "malformed body"),
        (msgpack.ExtType(9, _pack([1])), [], "unknown extension code"),
        (_custom("nosuch", None, 0), [b"\0" * 8], "no codec extension named 'nosuch'"),
        (_custom(5, None, 0), [b"\0" * 8], "custom extension"),
        (_custom("torch", ["float32", [3]], 0), [b"\0" * 8], "rejected its buffer"),
        (_custom("torch", ["notadtype", [2]], 0), [b"\0" * 8], "rejected its buffer"),
    ],
    ids=lambda v: repr(v)[:40] if not isinstance(v, msgpack.ExtType) else f"ext{v.code}",
)
def test_bad_buffer_references(payload: Any, buffers: list[bytes], match: str) -> None:
    """Extension references must point at exactly one frame each, of the declared size."""
    with pytest.raises(BadFrame, match=match):
        Codec().decode([_pack(_header(payload=payload)), *buffers])


def test_oversized_message_is_refused() -> None:
    """A message whose frames add up to more than the limit raises MessageTooLarge."""
    codec = Codec(max_message_bytes=1000)
    frames = _wire(Codec().encode(_tell(np.zeros(1000, dtype=np.uint8))))
    with pytest.raises(MessageTooLarge, match="max_message_mb"):
        codec.decode(frames)
    with pytest.raises(MessageTooLarge, match="max_message_mb"):  # and the sender refuses it too
        codec.encode(_tell(np.zeros(1000, dtype=np.uint8)))
    exact = Codec(max_message_bytes=sum(len(f) for f in frames))
    assert exact.decode(frames).payload.shape == (1000,)


def test_a_message_refused_for_its_size_names_the_envelope_it_came_in() -> None:
    """Refused unread, it was answered with corr_id 0, which no asker waits on: the ask waited
    out its deadline (600 s for a pipeline's call). The ids come from the header's first bytes,
    whatever the size of the frames that follow or of the header itself."""
    codec = Codec(max_message_bytes=1000, max_frames=4)
    ask = _tell(np.zeros(2000, dtype=np.uint8), kind=Kind.ASK, msg_id=41, target="render")
    reply = _tell(np.zeros(2000, dtype=np.uint8), kind=Kind.REPLY, msg_id=0, corr_id=9, type="")
    many = _tell([np.zeros(1)] * 4, kind=Kind.ASK, msg_id=42, target="render")
    one_frame = [_pack(_header(kind=int(Kind.ASK), msg_id=43, target="render", payload="x" * 5000))]
    cases = [
        (ask, (Kind.ASK, 41, 0, "render")),
        (reply, (Kind.REPLY, 0, 9, "counter")),
        (many, (Kind.ASK, 42, 0, "render")),
    ]
    for env, ids in cases:
        with pytest.raises(MessageTooLarge) as info:
            codec.decode(_wire(Codec().encode(env)))
        assert info.value.envelope == ids, (env, info.value.envelope)
    with pytest.raises(MessageTooLarge) as info:
        codec.decode(one_frame)
    assert info.value.envelope == (Kind.ASK, 43, 0, "render")
    # Where the first fields are not a sound envelope, there is nobody to answer.
    for header in (b"\x93\x01\x02\x03" + b"x" * 2000, _pack(_header(version=99, payload="x" * 2000))):
        with pytest.raises(ProtocolError) as refused:
            codec.decode([header])
        assert refused.value.envelope is None


def test_an_oversized_reply_says_it_is_a_reply_and_where_the_bound_is_set() -> None:
    """It said "message ''" and named the node's option only; a pipeline's replica sets it in
    its [pipeline] table."""
    with pytest.raises(MessageTooLarge) as info:
        Codec(max_message_bytes=100).encode_reply(7, "node/w/a", "x" * 200)
    said = str(info.value)
    assert said.startswith("a reply of ") and "[node]" in said and "[pipeline]" in said, said


def test_the_advice_names_the_node_options_only_where_they_are_the_limits() -> None:
    """The master answered a message of too many frames with "raise the node option
    max_frames", an option `troupe master start` does not have: a codec whose limits are no
    option (the master's, the supervisor's, a CLI client's) states the limit only."""
    frames = [_pack(_header()), *([b""] * 8)]
    big = [_pack(_header(payload="x" * 200))]
    for node_limits, said in ((True, "raise"), (False, "")):
        codec = Codec(max_message_bytes=100, max_frames=4, node_limits=node_limits)
        with pytest.raises(MessageTooLarge) as too_many:
            codec.decode(frames)
        with pytest.raises(MessageTooLarge) as too_big:
            codec.decode(big)
        with pytest.raises(MessageTooLarge) as sent:
            codec.encode(_tell([np.zeros(1)] * 4))
        texts = (str(too_many.value), str(too_big.value), str(sent.value))
        if node_limits:
            assert "node option max_frames" in texts[0] and "max_message_mb" in texts[1], texts
            assert "node option max_frames" in texts[2], texts
        else:
            assert texts[0] == "message of 9 frames exceeds the limit of 4; send fewer, larger arrays"
            assert "option" not in texts[1] and "max_message_mb" not in texts[1], texts[1]
            assert "option" not in texts[2], texts[2]
        assert all(said in t for t in texts)


@pytest.mark.parametrize(
    ("payload", "buffers"),
    [
        (_nd("<" + "x" * 100_000, [1], 0), [b"\0" * 8]),
        (_nd("<f4", ["x" * 100_000], 0), [b"\0" * 8]),
        (_nd("<f4", [2], "x" * 100_000), [b"\0" * 8]),
        (_custom("x" * 100_000, None, 0), [b"\0" * 8]),
    ],
    ids=["dtype", "shape", "index", "extension-name"],
)
def test_a_bad_frame_shows_a_peers_value_cut(payload: Any, buffers: list[bytes]) -> None:
    """A bad frame's reason goes back to the peer and into the log: the value it names is cut."""
    with pytest.raises(BadFrame) as refused:
        Codec().decode([_pack(_header(payload=payload)), *buffers])
    assert "xxx..." in str(refused.value) and len(str(refused.value)) < 300, str(refused.value)


def test_oversized_header_alone_is_refused() -> None:
    """The limit also applies to a message that is only a header."""
    with pytest.raises(MessageTooLarge):
        Codec(max_message_bytes=100).decode([_pack(_header(payload="x" * 200))])


# -- encoding errors ------------------------------------------------------------------------


class _Opaque:
    pass


@pytest.mark.parametrize(
    "payload",
    [{1, 2}, object(), _Opaque(), {"deep": [frozenset()]}, np.array([None, 1], dtype=object), 2**64],
    ids=["set", "object", "class", "nested-frozenset", "object-array", "too-big-int"],
)
def test_unencodable_payload_raises_encode_error(payload: Any) -> None:
    """A value with no wire encoding raises EncodeError, and the codec works afterwards."""
    codec = Codec()
    with pytest.raises(EncodeError):
        codec.encode(_tell({"ok": np.arange(2), "bad": payload}))
    out, frames = _roundtrip(_tell({"n": np.arange(3, dtype=np.int8)}), codec)
    np.testing.assert_array_equal(out.payload["n"], np.arange(3, dtype=np.int8))
    assert len(frames) == 2


def test_unencodable_header_raises_encode_error() -> None:
    """Headers are held to the same rules as the payload."""
    codec = Codec()
    with pytest.raises(EncodeError):
        codec.encode(_tell(1, headers={"s": {1}}))
    assert _roundtrip(_tell(1), codec)[0].payload == 1


def test_an_unencodable_reply_says_so_and_which_map_keys_travel() -> None:
    """A reply has no type: it is called a reply, not "message ''"; and the rule it gives for map
    keys is the README's (str, int or bytes), not "str keys"."""
    deep: list[Any] = []
    inner = deep
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]
    with pytest.raises(EncodeError) as caught:
        Codec().encode_reply(1, "n/p", deep)
    said = str(caught.value)
    assert said.startswith("cannot encode a reply: ") and "dicts with str, int or bytes keys" in said, said


def test_encode_error_is_a_type_error() -> None:
    """EncodeError is also a TypeError, so generic callers can catch it as one."""
    with pytest.raises(TypeError):
        Codec().encode(_tell({1, 2}))


def test_imported_extensions_are_loaded_up_front() -> None:
    """Extensions whose library the process imported (torch, here) load without a tensor."""
    from troupe.runtime.wire.codec import load_imported_extensions

    assert "torch" in load_imported_extensions()


def test_the_entry_points_are_read_once_per_process_and_a_templates_forks_inherit_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading every distribution's metadata for the codec entry points was half of a forked
    worker's start (twice, torch imported): a node's template reads them before it forks, and
    loading the torch extension afterwards reads nothing again."""
    import importlib.metadata

    from troupe.runtime.node import template
    from troupe.runtime.wire import codec

    fresh: dict[str, Any] = {
        "_declared": None,
        "_loaded_entry_points": set(),
        "_EXTENSIONS": {},
        "_EXT_BY_TYPE": {},
    }
    for name, value in fresh.items():
        monkeypatch.setattr(codec, name, value)
    template._read_codec_entry_points()  # what the template does before it says it is ready

    def read_again(**_: object) -> None:
        raise AssertionError("the entry points were read again")

    monkeypatch.setattr(importlib.metadata, "entry_points", read_again)
    assert "torch" in codec.load_imported_extensions()
    out, _ = _roundtrip(_tell({"t": torch.ones(3)}))
    assert torch.equal(out.payload["t"], torch.ones(3))


def test_every_error_code_is_documented_in_the_protocol() -> None:
    """A client reads error codes from docs/PROTOCOL.md section 8: every code troupe sends is there."""
    from pathlib import Path

    from troupe.runtime.errors import TroupeError

    def codes(cls: type[TroupeError]) -> set[str]:
        return {cls.code}.union(*(codes(sub) for sub in cls.__subclasses__()))

    text = (Path(__file__).resolve().parents[3] / "docs" / "PROTOCOL.md").read_text()
    section = text[text.index("## 8.") : text.index("## 9.")]
    assert sorted(c for c in codes(TroupeError) if f"`{c}`" not in section) == []


def test_a_header_nested_past_msgpack_s_depth_says_so() -> None:
    """msgpack's StackError has no message: the bad frame's reason was empty."""
    with pytest.raises(BadFrame, match="nested deeper than msgpack unpacks"):
        Codec().decode([b"\x91" * 100_000 + b"\xc0"])


@pytest.mark.parametrize("value", [2**70, -(2**64)])
def test_an_int_past_64_bits_is_named_as_such(value: int) -> None:
    """It said "no wire encoding for int", as if no int could travel."""
    codec = Codec()
    with pytest.raises(EncodeError, match=rf"int {value} is outside the 64 bits msgpack holds"):
        codec.encode_reply(1, "n/p", {"v": value})
    assert codec.decode(codec.encode_reply(2, "n/p", 2**64 - 1)).payload == 2**64 - 1  # the edge travels
