"""The replica's side of the direct data plane: what an output weighs, what a replica holds,
and how a batch's inputs are pulled from their holders (a holder that fails, or no longer holds
an item, makes that item lost, never the batch; one that leaves some for a later take is asked
again for them)."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np

from troupe.runtime.errors import AskTimeout
from troupe.runtime.pipeline.handoff import HeldOutputs, Outbox, payload_bytes, pull_inputs


def test_payload_bytes_counts_buffers_by_size_and_strings_by_length() -> None:
    frames = np.zeros((4, 8, 8, 3), dtype=np.uint8)  # 768 bytes
    item = {"task_id": "t-1", "frames": frames, "depth": [np.zeros(10, dtype=np.float32)], "n": 3}
    size = payload_bytes(item)
    assert frames.nbytes + 40 <= size < frames.nbytes + 40 + 200
    assert payload_bytes(b"x" * 5000) == 5000


def test_held_outputs_keep_until_released_and_count_their_bytes() -> None:
    held = HeldOutputs()
    held.put("a", {"x": 1}, 100)
    held.put("b", {"x": 2}, 50)
    assert held.take(["a", "missing"]) == ({"a": {"x": 1}}, [])
    assert len(held) == 2 and held.bytes == 150  # taking does not release
    held.put("a", {"x": 3}, 10)  # a retried call makes the same key again
    assert held.bytes == 60
    held.release(["a", "a", "never-held"])
    assert len(held) == 1 and held.bytes == 50


def test_a_take_holds_what_fits_its_room_and_leaves_the_rest_for_later() -> None:
    """Outputs by the sizes they were held with, first come first: one that does not fit waits
    for a later take, a smaller one after it still goes; the first goes whatever its size (it
    may encode to less than it weighs, or fail alone)."""
    held = HeldOutputs()
    for key, size in (("a", 60), ("b", 50), ("c", 30), ("big", 500)):
        held.put(key, key.upper(), size)
    assert held.take(["a", "b", "c", "a", "gone"], room=100) == ({"a": "A", "c": "C"}, ["b"])
    assert held.take(["big", "a"], room=100) == ({"big": "BIG"}, ["a"])
    assert held.take(["a", "b", "c", "big"]) == ({"a": "A", "b": "B", "c": "C", "big": "BIG"}, [])
    assert len(held) == 4 and held.bytes == 640  # taking does not release


async def test_pull_asks_again_for_what_a_holder_left_for_later_until_each_arrived() -> None:
    """A holder that answers two outputs a take and names the rest ``later`` is asked again for
    those alone, with the taker's budget each time: each item is filled once, none lost."""
    asked: list[Any] = []

    async def ask(actor: str, msg_type: str, payload: Any, timeout: float) -> Any:
        asked.append(payload)
        keys = payload["keys"]
        reply: dict[str, Any] = {"items": {k: k.upper() for k in keys[:2]}}
        return {**reply, "later": keys[2:]} if keys[2:] else reply

    sources = [["up-0/outbox", f"k{i}"] for i in range(5)]
    filled, lost, failed = await pull_inputs(ask, [None] * 5, sources, budget=1000)
    assert filled == ["K0", "K1", "K2", "K3", "K4"]
    assert not lost and not failed
    assert asked == [
        {"keys": ["k0", "k1", "k2", "k3", "k4"], "budget": 1000},
        {"keys": ["k2", "k3", "k4"], "budget": 1000},
        {"keys": ["k4"], "budget": 1000},
    ]


async def test_a_holder_that_hands_nothing_over_and_names_all_for_later_fails_the_take() -> None:
    """Asking again would go on for ever: those items fail (retried), none counted lost (which
    would take the holder for gone)."""
    calls = 0

    async def ask(actor: str, msg_type: str, payload: Any, timeout: float) -> Any:
        nonlocal calls
        calls += 1
        return {"items": {}, "later": payload["keys"]}

    _, lost, failed = await pull_inputs(ask, [None] * 2, [["up-0/outbox", "k0"], ["up-0/outbox", "k1"]])
    assert calls == 1 and not lost
    assert set(failed) == {0, 1} and "handed none of the outputs asked over" in failed[0], failed


async def test_pull_fills_each_item_from_its_holder_and_marks_what_cannot_be_had() -> None:
    stores = {"up-0/outbox": {"k0": "zero", "k2": "two"}}
    asked: list[tuple[str, list[str]]] = []

    async def ask(actor: str, msg_type: str, payload: Any, timeout: float) -> Any:
        assert msg_type == "stage_take"
        asked.append((actor, payload["keys"]))
        if actor not in stores:
            raise AskTimeout(f"no reply from {actor}")
        return {"items": {k: v for k, v in stores[actor].items() if k in payload["keys"]}}

    items = [None, "inline", None, None, None]
    sources = [
        ["up-0/outbox", "k0"],
        None,
        ["up-0/outbox", "k2"],
        ["up-0/outbox", "k-gone"],
        ["dead/outbox", "k4"],
    ]
    filled, lost, failed = await pull_inputs(ask, items, sources)
    assert filled[:3] == ["zero", "inline", "two"]
    assert set(lost) == {3, 4}
    assert "no longer holds" in lost[3] and "AskTimeout" in lost[4]
    assert not failed
    assert sorted(asked) == [
        ("dead/outbox", ["k4"]),
        ("up-0/outbox", ["k0", "k2", "k-gone"]),
    ]  # one ask per holder


async def test_an_output_its_holder_could_not_hand_over_fails_that_item_alone() -> None:
    """A holder whose take could not be encoded whole answers the outputs that can be, and why
    for each one that cannot (``refused``): only that item fails, and the others are filled."""
    why = "EncodeError: stage a: process returned an output that cannot be sent: ..."

    async def ask(actor: str, msg_type: str, payload: Any, timeout: float) -> Any:
        return {"items": {"k0": "zero", "k2": "two"}, "refused": {"k1": why}}

    sources = [["up-0/outbox", f"k{i}"] for i in range(3)]
    filled, lost, failed = await pull_inputs(ask, [None] * 3, sources)
    assert (filled[0], filled[2]) == ("zero", "two")
    assert failed == {1: why}
    assert not lost


async def test_a_stopping_replica_ends_its_pulls_and_starts_none() -> None:
    """Stopping, a replica's drain must not wait on holders that may be stopping too: the pull
    under way ends at once, a later one pulls nothing, and both items count as lost."""
    asking = anyio.Event()

    async def ask(actor: str, msg_type: str, payload: Any, timeout: float) -> Any:
        asking.set()
        await anyio.sleep_forever()  # a holder that never answers (it is gone)

    outbox = Outbox()
    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                pulled: list[Any] = []

                async def pull() -> None:
                    pulled.append(await pull_inputs(ask, [None], [["up-0/outbox", "k0"]]))

                tg.start_soon(pull)
                await asking.wait()
                outbox.stop_requested()
            _, lost, _ = pulled[0]
            assert lost == {0: "this replica is stopping"}
            _, later, _ = await pull_inputs(ask, [None], [["up-0/outbox", "k1"]])
            assert later == {0: "this replica is stopping"}
    finally:
        await outbox.started()  # this process's next replica pulls again
    _, fresh_lost, _ = await pull_inputs(_holder_with("k2"), [None], [["up-0/outbox", "k2"]])
    assert fresh_lost == {}


async def test_a_holder_the_engine_lost_is_asked_no_more_by_the_calls_queued_here() -> None:
    """The engine tells a replica that a holder is gone while that replica's call in progress
    pulls nothing from it (the calls behind it, already sent, pull later): those later pulls
    must not ask the dead holder, which would keep them waiting ``PULL_TIMEOUT_S``; their
    items count as lost at once. Other holders are still asked, and the process's next
    replica starts with nothing gone."""
    asked: list[str] = []

    async def ask(actor: str, msg_type: str, payload: Any, timeout: float) -> Any:
        asked.append(actor)
        if actor == "up-0/outbox":
            await anyio.sleep_forever()  # what a dead holder's stale endpoint does
        return {"items": dict.fromkeys(payload["keys"], "value")}

    outbox = Outbox()
    try:
        with anyio.fail_after(30):
            outbox._holder_gone({"holder": "up-0/outbox"})  # the engine's stage_holder_gone
            _, lost, failed = await pull_inputs(
                ask, [None, None], [["up-0/outbox", "k0"], ["up-1/outbox", "k1"]]
            )
        assert lost == {0: "holder up-0/outbox is gone (the engine lost its replica)"}
        assert not failed
        assert asked == ["up-1/outbox"]
    finally:
        await outbox.started()
    _, fresh_lost, _ = await pull_inputs(_holder_with("k2"), [None], [["up-0/outbox", "k2"]])
    assert fresh_lost == {}


def _holder_with(key: str) -> Any:
    async def ask(actor: str, msg_type: str, payload: Any, timeout: float) -> Any:
        return {"items": {key: "value"}}

    return ask
