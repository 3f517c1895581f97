"""A batch's outcomes that each fit the message bound but together pass it reach the engine, each
once.

A replica answers the engine's call (``process``, ``process_direct``) with one reply holding an
outcome per item. Outcomes that each fit the bound but together passed it failed the whole batch:
the reply could not be encoded, and every item of it was retried (made again: a last stage's
committed again), then dead. Now, where the engine says what it receives whole with its call
(``budget``, ``frames``), the reply holds the outcomes that fit, in order, and names each other
one ``{"later": key}``, kept by the replica; the engine asks for those with ``process_rest``. An
output over the bound alone fails alone, and an engine that says no limits (an older one, which
reads no ``later``) is answered as before.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np
import pytest

from troupe.runtime import Runtime
from troupe.runtime.core.ref import ActorRef
from troupe.runtime.errors import MessageTooLarge, ProtocolError
from troupe.runtime.lowlevel import MemoryHub
from troupe.runtime.pipeline.replica_calls import _read_rest
from troupe.runtime.pipeline.stage import StageActor
from troupe.runtime.wire.codec import Codec

WAIT_S = 10.0
NODE = "n"
BOUND = 256 << 10  # the replica's message bound, in bytes
JUST_UNDER_HALF = BOUND // 2 - 4096
ITEMS = 5
_made: list[int] = []  # the seeds the stage made, in order (one process: the test's)

_output_of: Any = lambda seed: np.full(JUST_UNDER_HALF, seed, np.uint8)  # noqa: E731


class MakeStage(StageActor):
    """The item's output is ``_output_of(seed)`` (the test sets it)."""

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        _made.append(item["seed"])
        return {"task_id": item["task_id"], "seed": item["seed"], "out": _output_of(item["seed"])}


class AsyncMakeStage(MakeStage):
    async def process(self, item: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        await anyio.lowlevel.checkpoint()
        return super().process(item)


@asynccontextmanager
async def _replica(
    cls: type[StageActor] = MakeStage, bound: int = BOUND, engine_bound: int = 64 << 20
) -> AsyncIterator[tuple[ActorRef, Runtime]]:
    """A replica of ``cls`` in runtime ``b`` (message bound ``bound``), as the engine in runtime
    ``a`` (bound ``engine_bound``) refers to it, told its stage's name ("make")."""
    hub = MemoryHub()
    _made.clear()
    async with (
        Runtime(NODE, "a", hub.transport(name="a"), codec=Codec(engine_bound), ask_timeout=WAIT_S) as a,
        Runtime(NODE, "b", hub.transport(name="b"), codec=Codec(bound), drain_timeout=0.5) as b,
    ):
        await b.spawn(cls, "stage")
        a.directory.learn(f"{NODE}/b/stage", b.cells["stage"].endpoint)
        ref = a.ref(f"{NODE}/b/stage")
        await ref.ask("stage_info", {"stage": "make"})
        while not b.cells["stage"].idle():  # a plain process is then handled as it is read
            await anyio.lowlevel.checkpoint()
        yield ref, a


def _items() -> list[dict[str, Any]]:
    return [{"task_id": f"p-{seed:06d}", "seed": seed} for seed in range(ITEMS)]


def _limits(a: Runtime) -> dict[str, int]:
    """What the engine says it receives whole, as the engine's calls do."""
    return {"budget": a.codec.max_message_bytes, "frames": a.codec.max_frames}


async def _outcomes(ref: ActorRef, a: Runtime, msg_type: str = "process") -> tuple[list[Any], list[Any]]:
    """The batch's outcomes once every one named ``later`` was asked for, and each reply."""
    payload: dict[str, Any] = {"items": _items(), **_limits(a)}
    if msg_type == "process_direct":  # a last stage's inputs pulled: none here, all inline
        payload["from"] = [None] * ITEMS
    first = await ref.ask(msg_type, payload)
    replies: list[Any] = [first]
    outcomes = list(first["outcomes"])
    where = {o["later"]: i for i, o in enumerate(outcomes) if "later" in o}
    keys = list(where)
    while keys:
        rest = await ref.ask("process_rest", {"keys": keys, **_limits(a)})
        replies.append(rest)
        for key, outcome in rest["outcomes"].items():
            outcomes[where[key]] = outcome
        keys = rest.get("later", [])
    return outcomes, replies


def _assert_each_arrived(outcomes: list[Any], skip: int = -1) -> None:
    for seed, outcome in enumerate(outcomes):
        if seed != skip:
            out = outcome["ok"]
            assert out["seed"] == seed and np.array_equal(out["out"], _output_of(seed)), seed


@pytest.mark.parametrize("cls", [MakeStage, AsyncMakeStage])
@pytest.mark.parametrize("msg_type", ["process", "process_direct"])
async def test_outcomes_that_together_pass_the_bound_reach_the_engine_each_once(
    cls: type[StageActor], msg_type: str
) -> None:
    """Five outputs of just under half the bound: the reply holds two, names three ``later``,
    and the engine takes those in two more replies; each item was made once."""
    with anyio.fail_after(WAIT_S):
        async with _replica(cls) as (ref, a):
            outcomes, replies = await _outcomes(ref, a, msg_type)
            again = await ref.ask("process_rest", {"keys": ["0", "1", "2"], **_limits(a)})
    _assert_each_arrived(outcomes)
    assert _made == list(range(ITEMS))  # made once each: nothing ran again
    first = replies[0]["outcomes"]
    assert [("ok" in o, "later" in o) for o in first] == [(True, False)] * 2 + [(False, True)] * 3, first
    assert [len(r["outcomes"]) for r in replies[1:]] == [2, 1], replies[1:]
    assert again == {"outcomes": {}}  # each went once, and is kept no more


async def test_an_older_engine_is_answered_as_before() -> None:
    """An engine that says no limits reads no ``later``: the batch's reply fails whole, as it did."""
    with anyio.fail_after(WAIT_S):
        async with _replica() as (ref, _):
            with pytest.raises(MessageTooLarge, match="'process' handler"):
                await ref.ask("process", {"items": _items()})
            fits = await ref.ask("process", {"items": _items()[:1]})
    assert [set(o) for o in fits["outcomes"]] == [{"ok"}], fits


async def test_an_engine_of_a_smaller_bound_gets_replies_under_its_own() -> None:
    """The replica's bound is four times the engine's: its codec would let a reply of all five
    go, which the engine would refuse on receipt; the engine says its bound with the call, and
    the reply keeps under it."""
    with anyio.fail_after(WAIT_S):
        async with _replica(bound=4 * BOUND, engine_bound=BOUND) as (ref, a):
            outcomes, replies = await _outcomes(ref, a)
    _assert_each_arrived(outcomes)
    assert max(sum("ok" in o for o in r["outcomes"]) for r in replies[:1]) == 2, replies
    assert [len(r["outcomes"]) for r in replies[1:]] == [2, 1], replies[1:]


async def test_an_output_over_the_engines_bound_alone_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """An output the replica's codec lets go and the engine could not take is that item's error,
    naming the engine's bound and the [pipeline] max_message_mb that raises it (the engine's
    process takes it); the others arrive."""
    culprit = 2
    big = np.zeros(BOUND + 1, np.uint8)
    monkeypatch.setitem(globals(), "_output_of", lambda seed: big if seed == culprit else _fitting(seed))
    with anyio.fail_after(WAIT_S):
        async with _replica(bound=4 * BOUND, engine_bound=BOUND) as (ref, a):
            outcomes, _ = await _outcomes(ref, a)
    error = outcomes[culprit]["error"]
    assert error.startswith("MessageTooLarge: stage make: process returned an output of "), error
    assert f"the engine's message bound is {BOUND} bytes" in error, error
    assert "raise max_message_mb ([pipeline] of the pipeline's config, which the engine's" in error, error
    _assert_each_arrived(outcomes, skip=culprit)


@pytest.mark.parametrize("engine_says_limits", [True, False])
@pytest.mark.parametrize("over", [-64, 0, 1])
async def test_an_output_at_the_bound_is_said_as_one_over_it(
    over: int, engine_says_limits: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output a few bytes under the bound, at it, or over it: one line, the same for all (the
    codec's refusal of one at the bound named the whole reply's bytes, and one under it that fit
    alone but not in the reply's envelope named the internal handler's reply)."""
    culprit = 2
    big = b"\0" * (BOUND + over)
    monkeypatch.setitem(globals(), "_output_of", lambda seed: big if seed == culprit else b"small")
    with anyio.fail_after(WAIT_S):
        async with _replica(engine_bound=BOUND) as (ref, a):
            limits = _limits(a) if engine_says_limits else {}
            reply = await ref.ask("process", {"items": _items(), **limits})
    error = reply["outcomes"][culprit]["error"]
    said = re.fullmatch(
        r"MessageTooLarge: stage make: process returned an output of (\d+) bytes, which does not fit one "
        rf"message: the message bound is {BOUND} bytes, less 1024 for the reply around it; raise "
        r"max_message_mb \(\[pipeline\] of the pipeline's config, or \[node\] of the nodes'\) or send "
        r"the data by reference",
        error,
    )
    assert said and BOUND + over <= int(said[1]) < BOUND + over + 100, error
    assert [o["ok"]["out"] for i, o in enumerate(reply["outcomes"]) if i != culprit] == [b"small"] * (
        ITEMS - 1
    )


def _fitting(seed: int) -> np.ndarray:
    return np.full(JUST_UNDER_HALF, seed, np.uint8)


def test_the_engine_asks_again_for_what_a_rest_left_for_later_and_stops_on_nothing_handed() -> None:
    """A ``process_rest`` reply fills the outcomes it hands over and names the keys to ask again
    for; one that hands none over and names some for later would be asked for ever: it fails."""
    results: list[dict[str, Any]] = [{"ok": 0}, {"later": "a"}, {"later": "b"}, {"later": "c"}]
    where = {"a": 1, "b": 2, "c": 3}
    again = _read_rest({"outcomes": {"a": {"ok": 1}}, "later": ["b", "c"]}, ["a", "b", "c"], where, results)
    assert again == ["b", "c"] and results[1] == {"ok": 1}, results
    with pytest.raises(ProtocolError, match="handed none"):
        _read_rest({"outcomes": {}, "later": ["b", "c"]}, again, where, results)
    assert _read_rest({"outcomes": {"b": {"ok": 2}, "c": {"pruned": "x"}}}, again, where, results) == []
    assert results == [{"ok": 0}, {"ok": 1}, {"ok": 2}, {"pruned": "x"}]
