"""Control messages answered where they are read, without a task per message.

A plain (non-``async``) control handler is called by the receiving side at once and returns an
:class:`~troupe.runtime.core.router.Answer`: the reply now, or a future's result later, sent
from the future's callback. This is what lets a master answer a thousand workers without
starting a task per request. These tests hold the shortcut to what controls always promised:
arrival order, one reply per ask, the same errors, an ``async`` handler still in a task of its
own (a slow one holds up no other), and nothing left behind at shutdown. They run over both
transports, the ZeroMQ one on loopback.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from support.log_capture import module_logs
from troupe.runtime import AskTimeout, RemoteError, Runtime
from troupe.runtime.core import router
from troupe.runtime.core.router import Answer
from troupe.runtime.errors import BadRequest, UnknownMessageType
from troupe.runtime.lowlevel import MemoryHub
from troupe.runtime.transports.zmq import ZmqTransport

BOUND = 10.0
TRANSPORTS = ["memory", "zmq"]


@dataclass
class Pair:
    asker: Runtime
    server: Runtime

    async def call(self, control: str, payload: Any = None, timeout: float = BOUND) -> Any:
        return await self.asker.control(self.server.address, control, payload, timeout=timeout)


@asynccontextmanager
async def _pair(kind: str) -> AsyncIterator[Pair]:
    hub = MemoryHub()
    if kind == "zmq":
        ta: Any = ZmqTransport("tcp://127.0.0.1:*")
        tb: Any = ZmqTransport("tcp://127.0.0.1:*")
    else:
        ta, tb = hub.transport(name="asker"), hub.transport(name="server")
    async with (
        Runtime("n", "asker", ta, ask_timeout=BOUND) as asker,
        Runtime("n", "server", tb, drain_timeout=0.5) as server,
    ):
        yield Pair(asker, server)


async def _until(predicate: Any) -> None:
    while not predicate():
        await anyio.lowlevel.checkpoint()


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_plain_controls_are_answered_in_arrival_order_without_a_task_each(kind: str) -> None:
    seen: list[int] = []
    tasks: set[Any] = set()

    def double(payload: Any) -> Answer:
        seen.append(payload)
        tasks.add(asyncio.current_task())
        return Answer.now(payload * 2)

    replies: dict[int, Any] = {}

    async def ask(pair: Pair, i: int) -> None:
        replies[i] = await pair.call("double", i)

    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            pair.server.register_control("double", double)
            async with anyio.create_task_group() as tg:
                for i in range(200):
                    tg.start_soon(ask, pair, i)
    assert seen == list(range(200))
    assert replies == {i: 2 * i for i in range(200)}
    # the reader ran them all: no task of their own (none at all on ZeroMQ's reader callback)
    assert len(tasks) <= 1


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_an_answer_from_a_future_is_sent_once_the_future_is_done(kind: str) -> None:
    loop = asyncio.get_running_loop()
    first: asyncio.Future[int] = loop.create_future()
    second: asyncio.Future[int] = loop.create_future()
    called = anyio.Event()

    def later(payload: Any) -> Answer:
        called.set()
        # a chain: the first result picks the second answer
        return Answer(first, lambda a: Answer(second, lambda b: {"payload": payload, "sum": a + b}))

    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            pair.server.register_control("later", later)
            async with anyio.create_task_group() as tg:
                got: list[Any] = []

                async def ask() -> None:
                    got.append(await pair.call("later", "p"))

                tg.start_soon(ask)
                await called.wait()
                first.set_result(1)
                for _ in range(20):  # let the first callback run: nothing to send yet
                    await anyio.lowlevel.checkpoint()
                assert got == []
                second.set_result(2)
    assert got == [{"payload": "p", "sum": 3}]


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_slow_async_control_holds_up_no_plain_one(kind: str) -> None:
    entered, release = anyio.Event(), anyio.Event()

    async def hold(payload: Any) -> Any:
        entered.set()
        await release.wait()
        return payload

    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            pair.server.register_controls({"hold": hold, "ping": lambda _: Answer.now("pong")})
            async with anyio.create_task_group() as tg:
                held: list[Any] = []

                async def ask_hold() -> None:
                    held.append(await pair.call("hold", "slow"))

                tg.start_soon(ask_hold)
                await entered.wait()
                assert [await pair.call("ping") for _ in range(10)] == ["pong"] * 10
                assert held == []
                release.set()
    assert held == ["slow"]


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_plain_control_fails_like_any_handler(kind: str) -> None:
    loop = asyncio.get_running_loop()

    def raises(payload: Any) -> Answer:
        raise BadRequest(f"control 'raises': field 'n' must be int, has {payload!r}")

    def future_raises(_: Any) -> Answer:
        broken: asyncio.Future[int] = loop.create_future()
        loop.call_soon(broken.set_exception, BadRequest("control 'x': field 'y' must be int"))
        return Answer(broken)

    def later_raises(_: Any) -> Answer:  # its then runs from the future's callback
        zero: asyncio.Future[int] = loop.create_future()
        loop.call_soon(zero.set_result, 0)
        return Answer(zero, _inverse)

    async def coroutine_of(payload: Any) -> Any:
        return payload

    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            pair.server.register_controls(
                {
                    "raises": raises,
                    "then_raises": lambda _: Answer(_done(loop, 0), _inverse),
                    "future_raises": future_raises,
                    "later_raises": later_raises,
                    "returns_coroutine": lambda p: coroutine_of(p),
                }
            )
            with pytest.raises(BadRequest, match="field 'n' must be int, has 'abc'"):
                await pair.call("raises", "abc")
            with pytest.raises(RemoteError, match="division by zero"):
                await pair.call("then_raises")
            with pytest.raises(BadRequest, match="field 'y' must be int"):
                await pair.call("future_raises")
            with pytest.raises(RemoteError, match="division by zero"):
                await pair.call("later_raises")
            with pytest.raises(RemoteError, match="plain control handler returned a coroutine"):
                await pair.call("returns_coroutine", 1)
            with pytest.raises(UnknownMessageType, match="no control message 'nope'"):
                await pair.call("nope")
            # and it still serves
            pair.server.register_control("ok", lambda p: Answer.now(p))
            assert await pair.call("ok", [1, 2]) == [1, 2]


def _done(loop: asyncio.AbstractEventLoop, value: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = loop.create_future()
    future.set_result(value)
    return future


def _inverse(value: float) -> float:
    return 1 / value


async def test_an_answer_is_awaited_like_an_async_handlers_result() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    loop.call_soon(future.set_result, 20)
    assert await Answer.now({"a": 1}) == {"a": 1}
    assert await Answer(future, lambda v: Answer(_done(loop, v + 1), lambda w: w * 2)) == 42
    assert await Answer(_done(loop, "as is")) == "as is"


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_runtime_stops_cleanly_with_answers_still_pending(kind: str) -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[int] = loop.create_future()
    cancelled: asyncio.Future[int] = loop.create_future()
    called = 0

    def pending(payload: Any) -> Answer:
        nonlocal called
        called += 1
        return Answer(never if payload == "never" else cancelled, lambda v: v)

    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            pair.server.register_control("pending", pending)
            async with anyio.create_task_group() as tg:
                outcomes: list[str] = []

                async def ask(which: str) -> None:
                    try:
                        await pair.call("pending", which, timeout=0.3)
                    except AskTimeout:  # no reply: the answer never came
                        outcomes.append(which)

                tg.start_soon(ask, "never")
                tg.start_soon(ask, "cancelled")
                await _until(lambda: called == 2)
                cancelled.cancel()  # what a stopping dispatcher does to its callers
            assert sorted(outcomes) == ["cancelled", "never"]
    assert not never.done()


class _AsyncCallable:
    async def __call__(self, payload: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        return {"awaited": payload}


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_any_handler_that_makes_a_coroutine_runs_as_a_task(kind: str) -> None:
    async def handler(payload: Any) -> Any:
        return {"awaited": payload}

    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            pair.server.register_controls(
                {"object": _AsyncCallable(), "partial": functools.partial(handler), "function": handler}
            )
            for control in ("object", "partial", "function"):
                assert await pair.call(control, control) == {"awaited": control}


async def test_a_refusal_is_logged_as_information_and_a_fault_as_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A troupe error from a control handler is its answer to the asker (an unknown job, a
    drain of an unknown node): logged at info on the server, where every one had been a
    warning. Any other exception is a fault of the handler: a warning."""

    def refuses(_: Any) -> Answer:
        raise BadRequest("unknown job 'x'")

    def breaks(_: Any) -> Answer:
        raise KeyError("node")

    with anyio.fail_after(BOUND):
        async with _pair("memory") as pair:
            pair.server.register_controls({"refuses": refuses, "breaks": breaks})
            with module_logs(monkeypatch, router) as logs:
                with pytest.raises(BadRequest):
                    await pair.call("refuses")
                with pytest.raises(RemoteError):
                    await pair.call("breaks")
    levels = {e["type"]: e["log_level"] for e in logs if e["event"] == "control_failed"}
    assert levels == {"refuses": "info", "breaks": "warning"}
