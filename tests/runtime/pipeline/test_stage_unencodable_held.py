"""On the direct data plane, one item whose large output cannot travel fails alone, at once.

An output of ``inline_below`` bytes or more stays with the replica that made it, and the next
stage's replica takes it with one ``stage_take`` per holder. An output that could not be
encoded (a set in it) was held all the same: it failed only when the next stage took it, and
took with it every item of that take (``batch = 4``: three innocent ones), each dead with an
error naming the holder's outbox. An output holding itself hung the replica (its size was
counted forever). Now the holder refuses such an output as it would hold it: that item's
outcome is the error the engine plane gives (``EncodeError: stage a: process returned an output
that cannot be sent: ...``), retried as any; the others are held and taken. An output that
only may not encode (a list in it twice, an int subclass) is encoded to decide, and held. One
whose ``nbytes`` raises (a sparse torch tensor's) is one the codec decides too: sizing it failed
the whole batch with a raw ``RuntimeError``.

An output the holder's walk vouches for and the codec refuses (a str with a lone surrogate, a
numpy object array) is held, and its take's reply fails to encode: the outbox then answers the
others of the take, and that one under ``refused`` with its item's error.
"""

from __future__ import annotations

import enum
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from support.held_replica import held_replica
from troupe.runtime.pipeline.handoff import payload_weight
from troupe.runtime.pipeline.stage import StageActor

BOUND = 10.0
CULPRIT = 5
SEEDS = range(4, 8)
FRAME = 8192  # over inline_below (4096): held


class _Opaque:
    """An object msgpack has no encoding for."""


class _NoSize:
    """An object whose ``nbytes`` raises, as a sparse torch tensor's does: sizing it failed the
    whole batch's ``process`` call with that error."""

    @property
    def nbytes(self) -> int:
        raise RuntimeError("nbytes is not defined for sparse tensors")


def _holding_itself() -> dict[str, Any]:
    loop: dict[str, Any] = {"a": 1}
    loop["self"] = loop
    return loop


# The culprit's extra value, and what its item's error says of it.
UNSENDABLE = {
    "set": ({1, 2}, "no wire encoding for set"),
    "object": (_Opaque(), "no wire encoding for _Opaque"),
    "int past 64 bits": (2**64, "outside the 64 bits msgpack holds"),
    "holds itself": (_holding_itself(), "recursion limit exceeded"),
    "nbytes raises": (_NoSize(), "no wire encoding for _NoSize"),
}


class _Level(enum.IntEnum):
    HIGH = 2


_shared = [1, 2, 3]
# Values the walk cannot vouch for that encode all the same: such an output is held.
ENCODES = {"shared": [_shared, _shared], "int subclass": _Level.HIGH}
_culprit_value: Any = UNSENDABLE["set"][0]


def _output(item: dict[str, Any]) -> dict[str, Any]:
    out = {"task_id": item["task_id"], "seed": item["seed"], "frame": np.full(FRAME, item["seed"], np.uint8)}
    return {**out, "v": _culprit_value} if item["seed"] == CULPRIT else out


class PlainStage(StageActor):
    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        return _output(item)


class AsyncStage(StageActor):
    async def process(self, item: dict[str, Any]) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        return _output(item)


def _keys() -> list[str]:
    return [f"p-{seed:06d}/a/0" for seed in SEEDS]


def _call() -> dict[str, Any]:
    """A batch of four items, seeds 4 to 7, as the engine sends it to a stage that feeds another."""
    items = [{"task_id": f"p-{seed:06d}", "seed": seed} for seed in SEEDS]
    return {"items": items, "hold": _keys(), "inline_below": 4096}


@pytest.mark.parametrize("unsendable", sorted(UNSENDABLE))
@pytest.mark.parametrize("cls", [PlainStage, AsyncStage])
async def test_an_output_that_cannot_travel_is_its_items_error_and_the_others_are_taken(
    cls: type[StageActor], unsendable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    value, said = UNSENDABLE[unsendable]
    monkeypatch.setitem(globals(), "_culprit_value", value)
    with anyio.fail_after(BOUND):
        async with held_replica(cls, _keys()) as (stage, outbox):
            reply = await stage.ask("process_direct", _call())
            taken = await outbox.ask("stage_take", {"keys": _keys()})  # the next stage's take
    outcomes = reply["outcomes"]
    culprit = outcomes.pop(CULPRIT - SEEDS[0])
    assert "held" not in culprit and set(culprit) == {"error", "traceback"}, culprit
    error = culprit["error"]
    assert error.startswith("EncodeError: stage a: process returned an output that cannot be sent: "), error
    assert said in error, error
    innocent = {key: seed for key, seed in zip(_keys(), SEEDS, strict=True) if seed != CULPRIT}
    sizes = [payload_weight(_output({"task_id": key[:8], "seed": seed}))[0] for key, seed in innocent.items()]
    assert outcomes == [{"held": key, "bytes": size} for key, size in zip(innocent, sizes, strict=True)]
    assert sorted(taken["items"]) == sorted(innocent)  # the take did not fail for the culprit
    for key, seed in innocent.items():
        assert np.array_equal(taken["items"][key]["frame"], np.full(FRAME, seed, np.uint8))


@pytest.mark.parametrize("encodes", sorted(ENCODES))
async def test_an_output_that_only_may_not_travel_is_encoded_to_decide_and_held(
    encodes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(globals(), "_culprit_value", ENCODES[encodes])
    with anyio.fail_after(BOUND):
        async with held_replica(PlainStage, _keys()) as (stage, outbox):
            reply = await stage.ask("process_direct", _call())
            taken = await outbox.ask("stage_take", {"keys": _keys()})
    assert [set(o) for o in reply["outcomes"]] == [{"held", "bytes"}] * len(SEEDS), reply
    assert sorted(taken["items"]) == _keys()
    assert taken["items"][_keys()[CULPRIT - SEEDS[0]]]["v"] == (
        [[1, 2, 3], [1, 2, 3]] if encodes == "shared" else 2
    )


# Values the walk vouches for that the codec refuses: such an output is held, and refused when
# taken, that item alone (the outbox's ``reply_instead``); what its item's error says of it.
REFUSED_WHEN_TAKEN = {
    "lone surrogate": ("\ud800", "surrogates not allowed"),
    "numpy object array": (np.array([{1}], dtype=object), "numpy arrays of dtype object cannot travel"),
    "numpy complex scalar": (np.complex128(1j), "can not serialize 'complex' object"),
}


@pytest.mark.parametrize("refused", sorted(REFUSED_WHEN_TAKEN))
async def test_an_output_refused_only_when_taken_is_its_items_error_and_the_others_arrive(
    refused: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    value, said = REFUSED_WHEN_TAKEN[refused]
    monkeypatch.setitem(globals(), "_culprit_value", value)
    culprit_key = _keys()[CULPRIT - SEEDS[0]]
    with anyio.fail_after(BOUND):
        async with held_replica(PlainStage, _keys()) as (stage, outbox):
            reply = await stage.ask("process_direct", _call())
            taken = await outbox.ask("stage_take", {"keys": _keys()})
            alone = await outbox.ask("stage_take", {"keys": [culprit_key]})
            again = await outbox.ask("stage_take", {"keys": _keys()})  # still held: a retry says the same
    assert [set(o) for o in reply["outcomes"]] == [{"held", "bytes"}] * len(SEEDS), reply
    assert sorted(taken["items"]) == sorted(k for k in _keys() if k != culprit_key)
    assert list(taken["refused"]) == [culprit_key]
    error = taken["refused"][culprit_key]
    assert error.startswith("EncodeError: stage a: process returned an output that cannot be sent: "), error
    assert said in error, error
    assert alone == {"items": {}, "refused": taken["refused"]}
    assert sorted(again["items"]) == sorted(taken["items"]) and again["refused"] == taken["refused"]


def test_the_walk_vouches_for_plain_outputs_and_doubts_the_rest() -> None:
    """Maps, lists, str, bytes, numbers, arrays and numpy scalars are not doubted (they are not
    encoded before they are held); a set, an object, a large int, a container met twice are."""
    plain = {"a": [1, 2.5, True, None, "s", b"b", -(2**63), 2**64 - 1], "f": np.zeros(3), "n": np.float32(1)}
    assert payload_weight(plain) == (3 + (6 * 9 + 2) + 24 + 4, False)  # keys, the list, the arrays
    for value, _ in UNSENDABLE.values():
        assert payload_weight({"v": value})[1], value
    for value in ENCODES.values():
        assert payload_weight({"v": value})[1], value


def test_a_sparse_tensor_is_doubted_not_sized() -> None:
    """Its ``nbytes`` raises RuntimeError: the codec decides whether it travels."""
    torch = pytest.importorskip("torch")
    assert payload_weight({"v": torch.eye(3).to_sparse()}) == (1 + 9, True)
