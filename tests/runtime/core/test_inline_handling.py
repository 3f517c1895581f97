"""Messages handled at once by the receiving side, outside the actor's task.

When an actor is idle and a message for a synchronous handler arrives, the runtime runs the
handler right where the message was read (the transport's reader) and sends the reply without
waiting. These tests hold that shortcut to the semantics of the actor's task: one message at a
time, arrival order, the same context and log binding, the same errors, and fault-injection
hooks still honoured. They run over both transports, the ZeroMQ one on loopback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
import structlog

from troupe.runtime import Actor, ActorRef, AskTimeout, RemoteError, Runtime, handles
from troupe.runtime.core.cell import DROP
from troupe.runtime.lowlevel import MemoryHub
from troupe.runtime.transports.base import MemoryTransport
from troupe.runtime.transports.zmq import ZmqTransport

BOUND = 5.0
NODE = "n"
TRANSPORTS = ["memory", "zmq"]


class Ledger(Actor):
    """Sync handlers that record; an async one that can be held."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.entered = anyio.Event()
        self.release = anyio.Event()

    @handles("rec")
    def rec(self, payload: Any) -> None:
        self.seen.append(payload)

    @handles("seen")
    def get_seen(self, _: Any) -> list[Any]:
        return list(self.seen)

    @handles("whoami")
    def whoami(self, _: Any) -> dict[str, Any]:
        ctx = self.context
        assert ctx is not None
        return {
            "sender": ctx.sender,
            "type": ctx.type,
            "log_actor": structlog.contextvars.get_contextvars().get("actor"),
        }

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload

    @handles("fail")
    def fail(self, payload: Any) -> None:
        raise KeyError(payload)

    @handles("hold")
    async def hold(self, payload: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        self.seen.append(payload)
        return payload


@dataclass
class Pair:
    a: Runtime
    b: Runtime

    def ref(self, name: str) -> ActorRef:
        """A reference from ``a`` to the actor ``name`` hosted by ``b``."""
        self.a.directory.learn(f"{NODE}/b/{name}", self.b.cells[name].endpoint)
        return self.a.ref(f"{NODE}/b/{name}")

    async def spawn(self, actor: type[Actor] | Actor) -> ActorRef:
        """Start ``actor`` as "led" in ``b``, wait until its task waits for mail, refer to it from ``a``."""
        await self.b.spawn(actor, "led")
        while not self.b.cells["led"].idle():
            await anyio.lowlevel.checkpoint()
        return self.ref("led")


@asynccontextmanager
async def _pair(kind: str, make_b: Callable[[MemoryHub], Any] | None = None) -> AsyncIterator[Pair]:
    hub = MemoryHub()
    if kind == "zmq":
        ta: Any = ZmqTransport("tcp://127.0.0.1:*")
        tb: Any = ZmqTransport("tcp://127.0.0.1:*")
    else:
        ta = hub.transport(name="a")
        tb = make_b(hub) if make_b is not None else hub.transport(name="b")
    async with Runtime(NODE, "a", ta, ask_timeout=BOUND) as a, Runtime(NODE, "b", tb, drain_timeout=0.5) as b:
        yield Pair(a, b)


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_messages_wait_behind_a_busy_handler(kind: str) -> None:
    """While an async handler runs, messages for sync handlers queue and keep their order."""
    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            actor = Ledger()
            ref = await pair.spawn(actor)
            async with anyio.create_task_group() as tg:
                tg.start_soon(ref.ask, "hold", "first")
                await actor.entered.wait()
                for i in range(50):
                    await ref.tell("rec", i)
                # the tells are in the mailbox, not handled past the held message
                while pair.b.cells["led"].mailbox.statistics().depth < 50:
                    await anyio.lowlevel.checkpoint()
                assert actor.seen == []
                actor.release.set()
            assert await ref.ask("seen") == ["first", *range(50)]
            # the held ask and the tells queued behind it went through the task ("seen" may not)
            assert pair.b.statistics().actors["led"]["handled_at_once"] <= 1


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_an_idle_actor_handles_at_once_with_its_context_and_log_binding(kind: str) -> None:
    """A message handled outside the actor's task sees what it would see inside it."""
    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            ref = await pair.spawn(Ledger)
            got = await ref.ask("whoami")
            for i in range(100):
                await ref.tell("rec", i)
            assert await ref.ask("seen") == list(range(100))
            stats = pair.b.statistics().actors["led"]
    assert got == {"sender": f"{NODE}/a", "type": "whoami", "log_actor": "led"}
    assert stats["handled"] == stats["handled_at_once"] == 102 and not stats["busy"]


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_raising_sync_handler_answers_an_error_and_the_actor_goes_on(kind: str) -> None:
    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            ref = await pair.spawn(Ledger)
            with pytest.raises(RemoteError) as info:
                await ref.ask("fail", "key")
            await ref.tell("fail", "told")  # logged, no one to answer
            await ref.tell("rec", "after")
            assert await ref.ask("seen") == ["after"]
            stats = pair.b.statistics().actors["led"]
    assert info.value.remote_type == "builtins.KeyError"
    assert stats["failed"] == 2


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_before_handle_hooks_still_see_every_message(kind: str) -> None:
    """Fault injection hooks are async: with one installed, nothing takes the shortcut."""
    seen_by_hook: list[str] = []

    async def drop_recs(actor: str, msg_type: str) -> object:
        seen_by_hook.append(msg_type)
        return DROP if msg_type == "rec" else None

    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            ref = await pair.spawn(Ledger)
            pair.b.before_handle.append(drop_recs)
            await ref.tell("rec", 1)
            assert await ref.ask("seen") == []
            stats = pair.b.statistics().actors["led"]
    assert seen_by_hook == ["rec", "seen"]
    assert stats["dropped"] == 1


class ReluctantTransport(MemoryTransport):
    """Refuses (drops) the first reply, as a socket whose asker does not read would."""

    refused = 0

    def try_reply(self, route: Any, frames: list[Any]) -> bool:
        if self.refused == 0:
            self.refused += 1
            return False
        return super().try_reply(route, frames)


async def test_a_reply_that_cannot_leave_at_once_is_dropped_not_waited_on() -> None:
    """Nothing retries or waits on a dropped reply: that ask times out, the actor serves on."""
    transports: list[ReluctantTransport] = []

    def make_b(hub: MemoryHub) -> ReluctantTransport:
        t = ReluctantTransport(hub, "mem://b", 1000)
        hub.transports[t.address] = t
        transports.append(t)
        return t

    with anyio.fail_after(BOUND):
        async with _pair("memory", make_b) as pair:
            ref = await pair.spawn(Ledger)
            with pytest.raises(AskTimeout):
                await ref.ask("seen", timeout=0.2)
            assert [await ref.ask("seen") for _ in range(3)] == [[], [], []]
    assert transports[0].refused == 1


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_reply_with_several_buffer_frames_arrives_whole(kind: str) -> None:
    """Buffer frames, empty ones among them (the same bytes object twice), keep their places."""
    payload = {"a": np.arange(5.0), "b": np.ones((2, 2), np.int8), "empty": [np.zeros(0), np.zeros(0)]}
    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            ref = await pair.spawn(Ledger)
            got = await ref.ask("echo", payload)
            assert await ref.ask("echo", "next") == "next"
    np.testing.assert_array_equal(got["a"], payload["a"])
    assert [e.shape for e in got["empty"]] == [(0,), (0,)]
    np.testing.assert_array_equal(got["b"], payload["b"])


class TinyLedger(Ledger):
    """A Ledger whose mailbox holds two messages."""

    mailbox_capacity = 2


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_order_holds_from_at_once_to_a_full_mailbox_and_back(kind: str) -> None:
    """Handled at once, then queued past a full mailbox (the pump waits), then at once again:
    every message is handled once, in the order it was sent."""
    with anyio.fail_after(BOUND):
        async with _pair(kind) as pair:
            actor = TinyLedger()
            ref = await pair.spawn(actor)
            for i in range(5):
                await ref.tell("rec", i)  # at once: the actor is idle
            async with anyio.create_task_group() as tg:
                tg.start_soon(ref.ask, "hold", "held")
                await actor.entered.wait()
                sent = anyio.Event()

                async def flood() -> None:
                    for i in range(5, 25):  # far past the mailbox's two slots
                        await ref.tell("rec", i)
                    sent.set()

                tg.start_soon(flood)
                while pair.b.cells["led"].mailbox.statistics().depth < 2:
                    await anyio.lowlevel.checkpoint()
                assert actor.seen == list(range(5))
                actor.release.set()
                await sent.wait()
            for i in range(25, 30):
                await ref.tell("rec", i)
            assert await ref.ask("seen") == [*range(5), "held", *range(5, 30)]
            stats = pair.b.statistics().actors["led"]
    assert stats["mailbox_high_water"] == 2
    assert stats["handled_at_once"] >= 5  # the first five at least; the rest by either path
