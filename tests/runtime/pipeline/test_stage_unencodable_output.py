"""One item whose output cannot travel (a set, or a map key the reader refuses) fails alone,
not its batch.

A replica answers a batch with one reply; that reply failed to encode as a whole, and every item
of the batch (``batch = 4``: three innocent ones) died with an error naming the internal
``process_direct``. Now only the item whose output cannot be sent gets an error (retried as any
item error), naming the stage, its ``process`` and the type with no wire encoding; the others
come back ok. On both data planes (``process`` and ``process_direct``), for a plain and an async
``process`` (a reply sent where the message was read, and one sent from the actor's task).

A map key that is not a str, int or bin (a tuple, None, a float, a bool) msgpack packs, and only
the reader refused it, with the whole reply: every item of the batch died with a BadFrame that
named no stage. The replica now refuses it where it builds the batch's reply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest

from troupe.runtime import Runtime
from troupe.runtime.core.ref import ActorRef
from troupe.runtime.lowlevel import MemoryHub
from troupe.runtime.pipeline.stage import StageActor

BOUND = 10.0
NODE = "n"
CULPRIT = 5


# The culprit's output, and what its item's error says of it.
UNSENDABLE = {
    "set": ({1, 2}, "no wire encoding for set"),  # msgpack has no encoding for it
    "tuple key": ({"m": {(1, 2): 3}}, "map key (1, 2) of type tuple refused"),
    "None key": ([{"ok": 1}, {None: 1}], "map key None of type NoneType refused"),
    "float key": ({1.5: 2}, "map key 1.5 of type float refused"),
    "bool key": ({True: 2}, "map key True of type bool refused"),
}
_culprit_output: Any = UNSENDABLE["set"][0]


def _output(item: dict[str, Any]) -> dict[str, Any]:
    if item["seed"] == CULPRIT:
        return {"task_id": item["task_id"], "v": _culprit_output}
    # Keys the reader takes, at depth: an int, bytes, a numpy int (the codec packs its item()).
    return {"task_id": item["task_id"], "seed": item["seed"], "k": {7: [{b"b": np.int64(1)}], np.int64(3): 1}}


class PlainStage(StageActor):
    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        return _output(item)


class AsyncStage(StageActor):
    async def process(self, item: dict[str, Any]) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        return _output(item)


@asynccontextmanager
async def _replica(cls: type[StageActor], told_stage: bool = True) -> AsyncIterator[ActorRef]:
    """A replica of ``cls`` in runtime ``b``, as the engine in runtime ``a`` refers to it, told
    its stage's name ("a") as the engine tells a replica it started (``told_stage``)."""
    hub = MemoryHub()
    async with (
        Runtime(NODE, "a", hub.transport(name="a"), ask_timeout=BOUND) as a,
        Runtime(NODE, "b", hub.transport(name="b"), drain_timeout=0.5) as b,
    ):
        await b.spawn(cls, "stage")
        a.directory.learn(f"{NODE}/b/stage", b.cells["stage"].endpoint)
        ref = a.ref(f"{NODE}/b/stage")
        await ref.ask("stage_info", {"stage": "a"} if told_stage else None)
        while not b.cells["stage"].idle():  # a plain process is then handled as it is read
            await anyio.lowlevel.checkpoint()
        yield ref


def _call(plane: str) -> tuple[str, dict[str, Any]]:
    """A batch of four items, seeds 4 to 7, as the engine sends it on ``plane``."""
    items = [{"task_id": f"p-{seed:06d}", "seed": seed} for seed in range(4, 8)]
    if plane == "engine":
        return "process", {"items": items}
    hold = [f"{item['task_id']}/a/{i}" for i, item in enumerate(items)]
    return "process_direct", {"items": items, "hold": hold, "inline_below": 4096}


@pytest.mark.parametrize("unsendable", sorted(UNSENDABLE))
@pytest.mark.parametrize("cls", [PlainStage, AsyncStage])
@pytest.mark.parametrize("plane", ["engine", "direct"])
async def test_only_the_item_whose_output_cannot_travel_fails(
    cls: type[StageActor], plane: str, unsendable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    output, said = UNSENDABLE[unsendable]
    monkeypatch.setitem(globals(), "_culprit_output", output)
    msg_type, payload = _call(plane)
    with anyio.fail_after(BOUND):
        async with _replica(cls) as ref:
            reply = await ref.ask(msg_type, payload)
            again = await ref.ask(msg_type, payload)  # the replica goes on, and says the same
    outcomes = reply["outcomes"]
    assert [o.get("ok") for i, o in enumerate(outcomes) if i != CULPRIT - 4] == [
        {"task_id": f"p-{seed:06d}", "seed": seed, "k": {7: [{b"b": 1}], 3: 1}} for seed in (4, 6, 7)
    ]
    culprit = outcomes[CULPRIT - 4]
    assert "ok" not in culprit and set(culprit) == {"error", "traceback"}, culprit
    error = culprit["error"]
    assert error.startswith("EncodeError: stage a: process returned an output that cannot be sent"), error
    assert said in error, error
    assert "process_direct" not in error, error
    assert again["outcomes"] == outcomes


async def test_a_replica_not_told_its_stage_names_its_class() -> None:
    """An engine of an older troupe asks ``stage_info`` with no payload: the class is named."""
    msg_type, payload = _call("engine")
    with anyio.fail_after(BOUND):
        async with _replica(PlainStage, told_stage=False) as ref:
            reply = await ref.ask(msg_type, payload)
    error = reply["outcomes"][CULPRIT - 4]["error"]
    assert "stage class PlainStage: process returned an output that cannot be sent" in error, error
