"""A value a buffer extension cannot encode is refused as EncodeError, whatever the extension
raised; torch's lazy conjugate and negative views travel as the values they show.

A conjugate view (``t.conj()`` of a complex tensor) or a meta tensor made the torch extension
raise a RuntimeError or NotImplementedError (``numpy()`` refuses them), which the codec let
through as it was: the callers that fail one item alone catch the codec's errors only, so the
exception killed the stage replica's worker and every item of its batch with it. Now every
exception raised while packing is an EncodeError naming the value's type, and the torch
extension resolves conjugate and negative views and refuses the tensors that hold no dense
buffer, saying what to send instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from troupe.runtime.errors import EncodeError
from troupe.runtime.wire import codec as codec_module
from troupe.runtime.wire.codec import BufferExtension, Codec


def _roundtrip(value: Any) -> Any:
    codec = Codec()
    return codec.decode([bytes(f) for f in codec.encode_reply(1, "n/p", {"v": value})]).payload["v"]


def _refusal(value: Any) -> str:
    """The EncodeError of a reply holding ``value``; the codec still encodes after it."""
    codec = Codec()
    with pytest.raises(EncodeError) as caught:
        codec.encode_reply(1, "n/p", {"ok": np.arange(2), "bad": value})
    again = codec.decode([bytes(f) for f in codec.encode_reply(2, "n/p", {"n": np.arange(3)})])
    np.testing.assert_array_equal(again.payload["n"], np.arange(3))
    return str(caught.value)


@pytest.mark.parametrize(
    ("make", "shown"),
    [
        (lambda: torch.tensor([1 + 2j, 3 - 1j]).conj(), [1 - 2j, 3 + 1j]),
        (lambda: torch.tensor([1 + 2j, 3 - 1j]).conj().imag, [-2.0, 1.0]),  # the negative bit
        (lambda: torch.tensor([[1 + 1j, 2 + 0j], [0j, 4 - 4j]]).conj().T, [[1 - 1j, 0j], [2 + 0j, 4 + 4j]]),
    ],
    ids=["conj", "neg", "conj-transposed"],
)
def test_a_lazy_conjugate_or_negative_view_travels_as_the_values_it_shows(
    make: Any, shown: list[Any]
) -> None:
    view = make()
    assert view.is_conj() or view.is_neg()
    got = _roundtrip(view)
    assert not got.is_conj() and not got.is_neg()
    assert got.dtype == view.dtype
    assert got.tolist() == shown


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: torch.empty(2, device="meta"), "meta device holds no data: make it on a real device"),
        (
            lambda: torch.eye(3).to_sparse(),
            "a sparse_coo tensor has no dense buffer to send: send t.to_dense()",
        ),
    ],
    ids=["meta", "sparse"],
)
def test_a_tensor_without_a_dense_buffer_is_refused_saying_what_to_send(make: Any, said: str) -> None:
    refusal = _refusal(make())
    assert refusal.startswith("no wire encoding for this Tensor: "), refusal
    assert said in refusal, refusal


class _Foreign:
    """A value of a foreign library whose extension fails the way a library's call does."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _failing_to_buffer(value: _Foreign) -> tuple[Any, Any]:
    raise value.error


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("cannot read it"),
        NotImplementedError("not on this device"),
        KeyError("gone"),
        BufferError("x"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_any_exception_of_an_extension_is_an_encode_error_naming_the_type(
    error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    ext = BufferExtension("foreign", _Foreign, _failing_to_buffer, lambda meta, buf: None)
    monkeypatch.setitem(codec_module._EXTENSIONS, ext.name, ext)
    monkeypatch.setitem(codec_module._EXT_BY_TYPE, _Foreign, ext)
    refusal = _refusal(_Foreign(error))
    assert refusal.startswith("no wire encoding for this _Foreign: the 'foreign' extension failed on it: "), (
        refusal
    )
    assert type(error).__name__ in refusal, refusal


def test_an_exception_msgpack_raises_of_its_own_is_an_encode_error() -> None:
    """A memoryview that is not contiguous made msgpack raise BufferError, which escaped too."""
    refusal = _refusal(memoryview(np.arange(10, dtype=np.int32))[::2])
    assert refusal.startswith("cannot encode a reply: BufferError: "), refusal
