"""An ask's deadline means the same on both sides, whatever the hosts' wall clocks say.

Hosts whose clocks disagree by more than an ask's timeout (NTP not yet synced) dropped every ask
to the host ahead as expired on arrival, and a step of the wall clock expired the asks waiting
in a mailbox: an ask now carries its time to live, counted from its arrival on the receiver's
monotonic clock (core/message_deadline.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from troupe.runtime import Actor, Runtime, handles
from troupe.runtime.lowlevel import Codec, Envelope, Kind, MemoryHub, MemoryTransport

BOUND = 5.0  # seconds; every wait is bounded by it and normally takes milliseconds
NODE = "n"
TWO_HOURS = 7200.0


class Held(Actor):
    """Echoes asks; ``hold`` keeps it busy until released, so that the next ask waits queued."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.headers: list[Any] = []

    @handles("hold")
    async def hold(self, _: Any) -> str:
        self.entered.set()
        await self.release.wait()
        return "held"

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        assert self.context is not None
        self.headers.append(self.context.headers)
        return payload


@asynccontextmanager
async def _pair() -> AsyncIterator[tuple[MemoryHub, Runtime, Runtime]]:
    hub = MemoryHub()
    ta, tb = hub.transport(name="a"), hub.transport(name="b")
    async with Runtime(NODE, "a", ta) as a, Runtime(NODE, "b", tb, drain_timeout=0.5) as b:
        a.directory.learn(f"{NODE}/b", tb.address)
        yield hub, a, b


@pytest.mark.parametrize("path", ["remote", "local"])
async def test_an_ask_queued_while_the_wall_clock_steps_forward_is_still_answered(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NTP steps the clock two hours ahead while an ask waits in a busy actor's mailbox: it was
    dropped as expired, and its asker waited out the timeout for nothing."""
    real_time = time.time
    with anyio.fail_after(BOUND * 2):
        async with _pair() as (_hub, a, b):
            actor = Held()
            await b.spawn(actor, "held")
            if path == "remote":
                a.directory.learn(f"{NODE}/b/held", b.cells["held"].endpoint)
                ref = a.ref(f"{NODE}/b/held")
            else:
                ref = b.ref("held")
            async with anyio.create_task_group() as tg:
                tg.start_soon(ref.ask, "hold", None)
                await actor.entered.wait()
                answered: list[Any] = []

                async def ask_queued() -> None:
                    answered.append(await ref.ask("echo", "still wanted", timeout=BOUND))

                tg.start_soon(ask_queued)
                while b.statistics().actors["held"]["mailbox_depth"] < 1:  # the echo waits queued
                    await anyio.sleep(0.001)
                monkeypatch.setattr(time, "time", lambda: real_time() + TWO_HOURS)
                actor.release.set()
    assert answered == ["still wanted"]
    assert b.statistics().actors["held"]["expired"] == 0
    assert actor.headers == [None]  # the ttl the ask carried is the runtime's, not the handler's


def _ask_frames(msg_id: int, deadline: float, headers: dict[str, Any] | None) -> list[Any]:
    env = Envelope(Kind.ASK, msg_id, 0, "probe", "held", "echo", deadline, None, headers, msg_id)
    return Codec().encode(env)


async def _collector(
    transport: MemoryTransport, out: list[Envelope], got: anyio.Event, *, task_status: Any
) -> None:
    codec = Codec()

    async def on_message(_route: Any, frames: list[Any]) -> None:
        out.append(codec.decode(frames))
        got.set()

    await transport.serve(on_message, task_status=task_status)


async def _probe(*messages: list[Any]) -> tuple[list[Envelope], dict[str, Any]]:
    """Send ``messages`` from a foreign client; its replies (once one came) and the actor's
    figures."""
    replies: list[Envelope] = []
    got = anyio.Event()
    with anyio.fail_after(BOUND):
        async with _pair() as (hub, _a, b):
            await b.spawn(Held(), "held")
            probe = hub.transport(name="probe")
            async with anyio.create_task_group() as tg:
                await tg.start(_collector, probe, replies, got)
                for frames in messages:
                    await probe.send_raw(b.address, frames)
                await got.wait()
                tg.cancel_scope.cancel()
            probe.close()
            return replies, b.statistics().actors["held"]


async def test_an_ask_from_a_host_whose_clock_is_behind_lives_its_ttl() -> None:
    """A sender two hours behind puts a wall-clock deadline two hours in the receiver's past on
    the wire: its ``ttl`` decides. A sender older than the ttl, saying only that deadline, is
    read as before (expired), so no older peer's ask lives longer than it did."""
    skewed = time.time() - TWO_HOURS + BOUND
    replies, stats = await _probe(
        _ask_frames(1, skewed, None),  # an older sender
        _ask_frames(2, skewed, {"ttl": BOUND}),
    )
    assert [(r.kind, r.corr_id, r.payload) for r in replies] == [(Kind.REPLY, 2, 2)]
    assert stats["expired"] == 1 and stats["handled"] == 1


async def test_a_ttl_that_is_no_number_leaves_the_wall_clock_deadline_to_decide() -> None:
    """A peer's malformed ttl neither breaks the receiver nor keeps an expired ask alive."""
    replies, stats = await _probe(
        _ask_frames(1, time.time() - 1, {"ttl": "forever"}),
        _ask_frames(2, time.time() + BOUND, {"ttl": True}),
    )
    assert [(r.kind, r.corr_id) for r in replies] == [(Kind.REPLY, 2)]
    assert stats["expired"] == 1
