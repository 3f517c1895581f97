"""On the direct data plane, a take whose outputs together pass the message bound hands each over.

A replica keeps its outputs for the next stage, whose replica takes them with ``stage_take``,
several at once (a batch's inputs from one holder). Outputs that each fit the message bound but
together passed it failed the whole take: every item of it, each of which would have travelled
alone, retried and then dead. Now the holder answers what fits its reply (by the sizes it weighed
as it held them) and names the rest under ``later``, still held; the taker asks again for those
until each arrived, once. An output over the bound alone still fails alone, with an error that
names the bound and the setting that raises it. Where the weights misjudge what the outputs
encode to (a str of multibyte characters; more arrays than a message's frames), the reply that
fails to encode is split by what each output does encode to.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np
import pytest

from troupe.runtime import Runtime
from troupe.runtime.errors import MessageTooLarge
from troupe.runtime.lowlevel import MemoryHub
from troupe.runtime.pipeline.handoff import HELD, Outbox, pull_inputs
from troupe.runtime.pipeline.stage import StageActor
from troupe.runtime.wire.codec import Codec

WAIT_S = 10.0
NODE = "n"
BOUND = 256 << 10  # the replicas' message bound, in bytes
JUST_UNDER_HALF = BOUND // 2 - 4096
ITEMS = 5
OUTBOX = f"{NODE}/b/outbox"

_output_of: Callable[[int], Any] = lambda seed: np.full(JUST_UNDER_HALF, seed, np.uint8)  # noqa: E731


class MakeStage(StageActor):
    """The first stage: the item's output is ``_output_of(seed)`` (the test sets it)."""

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"task_id": item["task_id"], "seed": item["seed"], "out": _output_of(item["seed"])}


def _keys() -> list[str]:
    return [f"p-{seed:06d}/make/0" for seed in range(ITEMS)]


@asynccontextmanager
async def _holder(
    bound: int = BOUND,
    taker_bound: int = BOUND,
    max_frames: int = 1024,
    taker_frames: int = 1024,
    made: list[Any] | None = None,
) -> AsyncIterator[tuple[Runtime, list[dict[str, Any]]]]:
    """Runtime ``a`` (the next stage's replica), and the replies of every ``stage_take`` it
    asked, once runtime ``b``'s replica of ``MakeStage`` (message bound ``bound``, frames
    ``max_frames``) made and holds the outputs of items 0 to 4 (``made``: its outcomes, put
    there, not each held); ``a``'s own limits are ``taker_bound`` and ``taker_frames``."""
    hub = MemoryHub()
    replies: list[dict[str, Any]] = []
    try:
        async with (
            Runtime(
                NODE, "a", hub.transport(name="a"), codec=Codec(taker_bound, taker_frames), ask_timeout=WAIT_S
            ) as a,
            Runtime(
                NODE, "b", hub.transport(name="b"), codec=Codec(bound, max_frames), drain_timeout=0.5
            ) as b,
        ):
            for name, actor in (("make", MakeStage), ("outbox", Outbox)):
                await b.spawn(actor, name)
                a.directory.learn(f"{NODE}/b/{name}", b.cells[name].endpoint)
            await a.ref(f"{NODE}/b/make").ask("stage_info", {"stage": "make"})
            items = [{"task_id": f"p-{seed:06d}", "seed": seed} for seed in range(ITEMS)]
            answer = await a.ref(f"{NODE}/b/make").ask(
                "process_direct", {"items": items, "hold": _keys(), "inline_below": 4096}
            )
            if made is None:
                assert [set(o) for o in answer["outcomes"]] == [{"held", "bytes"}] * ITEMS, answer
            else:
                made.extend(answer["outcomes"])
            yield a, replies
    finally:
        HELD.release(_keys())
        await Outbox().started()


Pulled = tuple[list[Any], dict[int, str], dict[int, str]]


async def _pull(a: Runtime, replies: list[dict[str, Any]]) -> Pulled:
    """What the next stage's replica pulls of the five outputs, as its ``process_direct`` does."""

    async def ask(actor: str, msg_type: str, payload: Any, timeout: float) -> Any:
        reply = await a.ref(actor).ask(msg_type, payload, timeout=timeout)
        replies.append(reply)
        return reply

    sources = [[OUTBOX, key] for key in _keys()]
    return await pull_inputs(
        ask, [None] * ITEMS, sources, budget=a.codec.max_message_bytes, frames=a.codec.max_frames
    )


def _assert_each_arrived_once(filled: list[Any], replies: list[dict[str, Any]], skip: int = -1) -> None:
    for seed, item in enumerate(filled):
        if seed != skip:
            assert item["seed"] == seed and np.array_equal(item["out"], _output_of(seed)), seed
    handed = [key for reply in replies for key in reply["items"]]
    assert sorted(handed) == sorted(k for i, k in enumerate(_keys()) if i != skip), handed  # once each


async def test_outputs_that_each_fit_the_bound_arrive_though_together_they_pass_it() -> None:
    """Five outputs of just under half the bound each, in one take of two and a half bounds:
    each arrives, in takes of two, and each stays held until released."""
    with anyio.fail_after(WAIT_S):
        async with _holder() as (a, replies):
            filled, lost, failed = await _pull(a, replies)
            still_held = len(HELD)
    assert not failed and not lost, (failed, lost)
    _assert_each_arrived_once(filled, replies)
    assert [len(reply["items"]) for reply in replies] == [2, 2, 1], replies
    assert still_held == ITEMS  # a take does not release: a retry downstream takes them again


async def test_the_holder_answers_what_fits_and_names_the_rest_for_a_later_take() -> None:
    """The taker says its bound (``budget``) with each take: what fits under it and the
    holder's goes, the rest is named ``later``. An older taker, which says none and reads no
    ``later`` (it would count those items lost), is answered every output as before: the take
    fails whole, each of its items an error."""
    old_taker = {"keys": _keys()[:2]}  # two fit, under the holder's own bound
    with anyio.fail_after(WAIT_S):
        async with _holder() as (a, _):
            reply = await a.ref(OUTBOX).ask("stage_take", {"keys": _keys(), "budget": BOUND})
            small = await a.ref(OUTBOX).ask("stage_take", {"keys": _keys(), "budget": BOUND // 2})
            old = await a.ref(OUTBOX).ask("stage_take", old_taker)
            with pytest.raises(MessageTooLarge, match="stage_take"):
                await a.ref(OUTBOX).ask("stage_take", {"keys": _keys()})
    assert sorted(reply["items"]) == _keys()[:2] and reply["later"] == _keys()[2:], reply
    assert "refused" not in reply
    # A taker of a smaller bound gets one at a time (the first always: it may fit after all).
    assert sorted(small["items"]) == _keys()[:1] and small["later"] == _keys()[1:], small
    assert sorted(old) == ["items"] and sorted(old["items"]) == _keys()[:2], old


@pytest.mark.parametrize("over", [-64, 0, 1])
async def test_an_output_over_the_bound_is_the_making_stages_error_naming_the_bound_and_the_setting(
    over: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the bound, at it or a few bytes under (no room for the take's reply around it): it is
    refused as it would be held, its item's error the making stage's (it was held, and refused
    when taken: counted as the taking stage's error, while it named the making one); the others
    are held and taken."""
    culprit = 2
    big = np.zeros(BOUND + over, np.uint8)
    monkeypatch.setitem(globals(), "_output_of", lambda seed: big if seed == culprit else _fitting(seed))
    made: list[Any] = []
    with anyio.fail_after(WAIT_S):
        async with _holder(made=made) as (a, replies):
            filled, lost, failed = await _pull(a, replies)
    assert [set(o) for i, o in enumerate(made) if i != culprit] == [{"held", "bytes"}] * (ITEMS - 1), made
    assert not failed and list(lost) == [culprit], (failed, lost)  # not held: the engine asks none
    error = made[culprit]["error"]
    # Worded as every output over the bound is, on either data plane.
    said = re.match(r"MessageTooLarge: stage make: process returned an output of (\d+) bytes, ", error)
    assert said and BOUND + over < int(said[1]) < BOUND + over + 100, error
    assert f"the message bound is {BOUND} bytes, less 1024" in error, error
    assert "raise max_message_mb" in error, error
    assert "return maps" not in error, error  # what travels is no advice on a size
    _assert_each_arrived_once(filled, replies, skip=culprit)


async def test_an_output_that_fits_a_take_alone_is_held_however_near_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 bytes under the bound leaves room for the reply to a take of it alone (its envelope,
    the key): held, and taken, as before the holder weighed outputs near the bound."""
    culprit = 2
    near = np.full(BOUND - 200, 7, np.uint8)
    monkeypatch.setitem(globals(), "_output_of", lambda seed: near if seed == culprit else _fitting(seed))
    with anyio.fail_after(WAIT_S):
        async with _holder() as (a, replies):
            filled, lost, failed = await _pull(a, replies)
    assert not failed and not lost, (failed, lost)
    _assert_each_arrived_once(filled, replies)


async def test_a_taker_of_a_smaller_bound_gets_replies_under_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder's bound is four times the taker's: its replies keep under the taker's bound
    (the taker says it with each take), and an output over the taker's bound, which the holder's
    codec would let go and the taker refuse on receipt, fails alone, naming the taker's bound."""
    culprit = 2
    big = np.zeros(BOUND + 1, np.uint8)
    monkeypatch.setitem(globals(), "_output_of", lambda seed: big if seed == culprit else _fitting(seed))
    with anyio.fail_after(WAIT_S):
        async with _holder(bound=4 * BOUND) as (a, replies):
            filled, lost, failed = await _pull(a, replies)
    assert not lost and list(failed) == [culprit], (failed, lost)
    error = failed[culprit]
    said = re.match(r"MessageTooLarge: stage make: process returned an output of (\d+) bytes, ", error)
    assert said and BOUND < int(said[1]) < BOUND + 100, error  # as encoded: its array and its keys
    assert f"the taking replica's message bound is {BOUND} bytes" in error, error
    assert "raise max_message_mb" in error, error
    _assert_each_arrived_once(filled, replies, skip=culprit)
    assert max(len(reply["items"]) for reply in replies) == 2, replies


def _fitting(seed: int) -> np.ndarray:
    return np.full(JUST_UNDER_HALF, seed, np.uint8)


async def test_outputs_the_weights_misjudge_are_split_by_what_they_encode_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A str of three-byte characters weighs a third of what it encodes to: the holder puts
    more of them in a reply than fit, the reply fails to encode, and the holder splits it by
    each output's encoded size instead. Each arrives once."""
    monkeypatch.setitem(globals(), "_output_of", lambda seed: "\u20ac" * (BOUND // 7) + str(seed))
    with anyio.fail_after(WAIT_S):
        async with _holder() as (a, replies):
            filled, lost, failed = await _pull(a, replies)
    assert not failed and not lost, (failed, lost)
    _assert_each_arrived_once(filled, replies)
    assert all(1 <= len(reply["items"]) <= 2 for reply in replies), [len(r["items"]) for r in replies]


async def test_outputs_of_more_arrays_than_a_message_has_frames_are_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three arrays an output (over ``inline_below`` together: held), and messages of at most
    eight frames (the header and seven buffers): two outputs fit a reply, a third does not."""
    monkeypatch.setitem(globals(), "_output_of", lambda seed: [np.full(2048, seed, np.uint8)] * 3)
    with anyio.fail_after(WAIT_S):
        async with _holder(max_frames=8) as (a, replies):
            filled, lost, failed = await _pull(a, replies)
    assert not failed and not lost, (failed, lost)
    _assert_each_arrived_once(filled, replies)
    assert [len(reply["items"]) for reply in replies] == [2, 2, 1], replies


# -- the taker's limits: what it can receive whole, said with each take --------------------------


async def test_a_taker_of_a_smaller_bound_gets_multibyte_strs_it_can_receive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The holder's bound is four times the taker's, and its outputs are strs of three-byte
    characters, each weighing a third of what it encodes to: the holder's codec would let a
    reply of all five go (it fits the holder's bound), and the taker would refuse it on receipt.
    The holder weighs a tighter taker's replies by what they encode to: each arrives once."""
    monkeypatch.setitem(globals(), "_output_of", lambda seed: "\u20ac" * (BOUND // 7) + str(seed))
    with anyio.fail_after(WAIT_S):
        async with _holder(bound=4 * BOUND) as (a, replies):
            filled, lost, failed = await _pull(a, replies)
    assert not failed and not lost, (failed, lost)
    _assert_each_arrived_once(filled, replies)
    assert all(1 <= len(reply["items"]) <= 2 for reply in replies), [len(r["items"]) for r in replies]


async def test_a_multibyte_str_the_taker_cannot_receive_fails_alone_naming_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A str that weighs under the taker's bound and encodes to more than it: its item fails
    alone, naming the taker's bound; the others arrive."""
    culprit = 2
    big = "\u20ac" * (BOUND // 2)
    monkeypatch.setitem(globals(), "_output_of", lambda seed: big if seed == culprit else _fitting(seed))
    with anyio.fail_after(WAIT_S):
        async with _holder(bound=4 * BOUND) as (a, replies):
            filled, lost, failed = await _pull(a, replies)
    assert not lost and list(failed) == [culprit], (failed, lost)
    assert f"the taking replica's message bound is {BOUND} bytes" in failed[culprit], failed
    _assert_each_arrived_once(filled, replies, skip=culprit)


async def test_a_taker_of_fewer_frames_gets_replies_of_as_many_as_it_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The taker takes messages of at most eight frames, the holder 1024: the taker says its
    ``frames`` with each take, and two outputs of three arrays go a reply; an output of more
    arrays than the taker takes fails alone, naming its limit and what raises it."""
    culprit = 2
    many = [np.full(2048, culprit, np.uint8)] * 8
    monkeypatch.setitem(
        globals(),
        "_output_of",
        lambda seed: many if seed == culprit else [np.full(2048, seed, np.uint8)] * 3,
    )
    with anyio.fail_after(WAIT_S):
        async with _holder(taker_frames=8) as (a, replies):
            filled, lost, failed = await _pull(a, replies)
    assert not lost and list(failed) == [culprit], (failed, lost)
    error = failed[culprit]
    assert error.startswith("MessageTooLarge: stage make: process returned an output of 8 arrays"), error
    assert "the taking replica's max_frames is 8" in error and "raise max_frames" in error, error
    for seed, item in enumerate(filled):
        if seed != culprit:
            assert item["seed"] == seed and len(item["out"]) == 3, seed
    assert [len(reply["items"]) for reply in replies] == [2, 2], replies


async def test_a_take_that_says_no_frames_is_answered_by_the_holders_own_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An older taker says its ``budget`` and no ``frames``: the holder weighs by its own frame
    limit, as before (all five outputs of three arrays in one reply of 16 frames)."""
    monkeypatch.setitem(globals(), "_output_of", lambda seed: [np.full(2048, seed, np.uint8)] * 3)
    with anyio.fail_after(WAIT_S):
        async with _holder() as (a, _):
            older = await a.ref(OUTBOX).ask("stage_take", {"keys": _keys(), "budget": BOUND})
            newer = await a.ref(OUTBOX).ask("stage_take", {"keys": _keys(), "budget": BOUND, "frames": 8})
    assert sorted(older) == ["items"] and sorted(older["items"]) == _keys(), older
    assert sorted(newer["items"]) == _keys()[:2] and newer["later"] == _keys()[2:], newer
