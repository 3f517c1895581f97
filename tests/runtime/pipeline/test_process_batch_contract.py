"""``process_batch``, plain or async, returns one outcome per item, and a return of another form
is said in one line naming the stage.

A plain ``def process_batch`` failed every item with ``TypeError: object list can't be used in
'await' expression``; outputs returned as they are (what ``process`` returns) died as ``None``;
a list one short as ``coroutine raised StopIteration``, with no stage named. Now a plain one is
run as a plain ``process`` is, and what it returns is checked (``batch_outcomes``): a return that
is not a list of one outcome per item fails the batch, an outcome of another form its item.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from troupe.runtime import Runtime
from troupe.runtime.core.ref import ActorRef
from troupe.runtime.lowlevel import MemoryHub
from troupe.runtime.pipeline.stage import StageActor

WAIT_S = 10.0
NODE = "n"

_returns: Any = "outcomes"  # what the stages below return (the test sets it)


def _returned(items: list[dict[str, Any]]) -> Any:
    outputs = [{"task_id": item["task_id"], "n": item["seed"]} for item in items]
    if _returns == "outcomes":  # the contract, each form once
        return [{"ok": outputs[0]}, {"pruned": "too small"}, {"error": "disk full", "traceback": "tb"}] + [
            {"ok": out} for out in outputs[3:]
        ]
    if _returns == "outputs":
        return outputs
    if _returns == "short":
        return [{"ok": out} for out in outputs[:-1]]
    if _returns == "tuple":
        return tuple({"ok": out} for out in outputs)
    if _returns == "generator":
        return ({"ok": out} for out in outputs)
    return None


class PlainBatch(StageActor):
    def process_batch(self, items: list[Any]) -> Any:  # type: ignore[override]
        return _returned(items)


class AsyncBatch(StageActor):
    async def process_batch(self, items: list[Any]) -> Any:
        await anyio.lowlevel.checkpoint()
        return _returned(items)


@asynccontextmanager
async def _replica(cls: type[StageActor]) -> AsyncIterator[ActorRef]:
    """A replica of ``cls`` in runtime ``b``, as the engine in runtime ``a`` refers to it, told
    its stage's name ("gen")."""
    hub = MemoryHub()
    async with (
        Runtime(NODE, "a", hub.transport(name="a"), ask_timeout=WAIT_S) as a,
        Runtime(NODE, "b", hub.transport(name="b"), drain_timeout=0.5) as b,
    ):
        await b.spawn(cls, "stage")
        a.directory.learn(f"{NODE}/b/stage", b.cells["stage"].endpoint)
        ref = a.ref(f"{NODE}/b/stage")
        await ref.ask("stage_info", {"stage": "gen"})
        while not b.cells["stage"].idle():  # a plain handler is then run as it is read
            await anyio.lowlevel.checkpoint()
        yield ref


def _call(plane: str) -> tuple[str, dict[str, Any]]:
    """A batch of four items as the engine sends it on ``plane`` (``direct``: held outputs)."""
    items = [{"task_id": f"p-{seed:06d}", "seed": seed} for seed in range(4)]
    if plane == "engine":
        return "process", {"items": items}
    hold = [f"{item['task_id']}/gen/{i}" for i, item in enumerate(items)]
    return "process_direct", {"items": items, "hold": hold, "inline_below": 4096}


async def _outcomes(
    cls: type[StageActor], plane: str, returns: str, monkeypatch: pytest.MonkeyPatch
) -> list[Any]:
    monkeypatch.setitem(globals(), "_returns", returns)
    msg_type, payload = _call(plane)
    with anyio.fail_after(WAIT_S):
        async with _replica(cls) as ref:
            reply = await ref.ask(msg_type, payload)
    outcomes: list[Any] = reply["outcomes"]
    return outcomes


@pytest.mark.parametrize("cls", [PlainBatch, AsyncBatch])
@pytest.mark.parametrize("plane", ["engine", "direct"])
async def test_each_outcome_form_is_answered_as_returned(
    cls: type[StageActor], plane: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes = await _outcomes(cls, plane, "outcomes", monkeypatch)
    assert outcomes == [
        {"ok": {"task_id": "p-000000", "n": 0}},
        {"pruned": "too small"},
        {"error": "disk full", "traceback": "tb"},
        {"ok": {"task_id": "p-000003", "n": 3}},
    ]


@pytest.mark.parametrize("cls", [PlainBatch, AsyncBatch])
async def test_a_tuple_of_outcomes_is_taken(cls: type[StageActor], monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = await _outcomes(cls, "engine", "tuple", monkeypatch)
    assert [o["ok"]["n"] for o in outcomes] == [0, 1, 2, 3]


@pytest.mark.parametrize("cls", [PlainBatch, AsyncBatch])
@pytest.mark.parametrize("plane", ["engine", "direct"])
async def test_outputs_returned_as_they_are_are_each_items_error(
    cls: type[StageActor], plane: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes = await _outcomes(cls, plane, "outputs", monkeypatch)
    for i, outcome in enumerate(outcomes):
        assert set(outcome) == {"error", "traceback"}, outcome
        assert outcome["error"] == (
            f"TypeError: stage gen: {cls.__qualname__}.process_batch returned a dict of keys 'task_id', 'n' "
            f"for item {i} of the batch, not an outcome: return one outcome per item, in order "
            '({"ok": output}, {"pruned": reason} or {"error": message})'
        )


@pytest.mark.parametrize(
    ("returns", "said"),
    [
        ("short", "returned 3 outcomes for 4 items"),
        ("generator", "returned a generator, not a list"),
        ("none", "returned None, not a list"),
    ],
)
@pytest.mark.parametrize("cls", [PlainBatch, AsyncBatch])
@pytest.mark.parametrize("plane", ["engine", "direct"])
async def test_a_return_not_one_outcome_per_item_fails_the_batch_in_one_line(
    cls: type[StageActor], plane: str, returns: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes = await _outcomes(cls, plane, returns, monkeypatch)
    assert len(outcomes) == 4
    for outcome in outcomes:
        error = outcome["error"]
        assert error.startswith(f"TypeError: stage gen: {cls.__qualname__}.process_batch {said}: "), error
        assert "\n" not in error and error.endswith(
            'in order ({"ok": output}, {"pruned": reason} or {"error": message})'
        )


def test_a_plain_process_batch_is_handled_as_a_plain_process_is() -> None:
    """Run as the message is read where the actor is idle, and on a worker thread where its
    outputs are held (what the direct plane's ``process_direct`` checks)."""
    assert PlainBatch.handler_table()["process"].fn is StageActor.process_plain
    assert AsyncBatch.handler_table()["process"].fn is not StageActor.process_plain
