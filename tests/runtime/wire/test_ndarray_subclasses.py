"""An ndarray subclass that holds more than its elements is refused; the others travel plain.

A numpy MaskedArray was packed as its elements alone and arrived a plain ndarray: its masked
values came back as valid data, silently. Now it is refused with an EncodeError saying what to
send (its ``.data`` and ``.mask``), as is any ndarray subclass the codec does not know to hold
only its elements. A memmap, a matrix and a recarray hold nothing else: they arrive as plain
arrays, elements, dtype and shape exact (docs/PROTOCOL.md 6.1).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from troupe.runtime.errors import EncodeError
from troupe.runtime.wire.codec import Codec


class _WithUnit(np.ndarray):
    """A subclass with state of its own, as astropy's Quantity holds a unit."""

    unit = "m"


def _roundtrip(value: Any) -> Any:
    codec = Codec()
    return codec.decode([bytes(f) for f in codec.encode_reply(1, "n/p", {"v": value})]).payload["v"]


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (
            lambda: np.ma.masked_array([1, 2], mask=[0, 1]),
            "a numpy MaskedArray cannot travel (its mask would be lost)",
        ),
        (
            lambda: np.ma.masked_array([1.5]),
            "send its .data and .mask",
        ),  # no value masked: refused all the same
        (lambda: np.ma.masked, "a numpy MaskedArray cannot travel"),
        (lambda: np.arange(3).view(_WithUnit), "a numpy ndarray subclass (_WithUnit) cannot travel as one"),
    ],
    ids=["masked", "nothing-masked", "masked-constant", "own-subclass"],
)
def test_a_subclass_that_holds_more_than_its_elements_is_refused(make: Any, said: str) -> None:
    codec = Codec()
    with pytest.raises(EncodeError) as caught:
        codec.encode_reply(1, "n/p", {"ok": np.arange(2), "bad": [make()]})
    assert said in str(caught.value), caught.value
    again = codec.decode([bytes(f) for f in codec.encode_reply(2, "n/p", np.arange(3))]).payload
    np.testing.assert_array_equal(again, np.arange(3))


def test_a_masked_arrays_parts_travel() -> None:
    """What the refusal says to send arrives whole."""
    masked = np.ma.masked_array([1, 2, 3], mask=[0, 1, 0])
    got = _roundtrip({"data": masked.data, "mask": np.ma.getmaskarray(masked)})
    rebuilt = np.ma.masked_array(got["data"], mask=got["mask"])
    assert rebuilt.tolist() == [1, None, 3]


def _memmap(tmp_path: Path) -> np.ndarray:
    mapped = np.memmap(tmp_path / "m.bin", dtype=np.float32, mode="w+", shape=(2, 3))
    mapped[:] = np.arange(6, dtype=np.float32).reshape(2, 3)
    return mapped


def _matrix(_: Path) -> np.ndarray:
    with warnings.catch_warnings():  # numpy means to deprecate matrix; users still have them
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        return np.matrix([[1, 2], [3, 4]], dtype=np.int16)


@pytest.mark.parametrize(
    "make",
    [
        _memmap,
        _matrix,
        lambda _: np.rec.array([(1, 2.5), (3, 4.5)], dtype=[("a", "<i4"), ("b", "<f8")]),
    ],
    ids=["memmap", "matrix", "recarray"],
)
def test_subclasses_that_hold_only_their_elements_arrive_as_plain_arrays(make: Any, tmp_path: Path) -> None:
    sent = make(tmp_path)
    got = _roundtrip(sent)
    assert type(got) is np.ndarray
    assert got.dtype == sent.dtype or got.dtype.descr == sent.dtype.descr
    assert got.shape == sent.shape
    assert got.tobytes() == np.asarray(sent).tobytes()
