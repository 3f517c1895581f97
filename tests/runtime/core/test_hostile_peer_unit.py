"""A peer that floods a runtime and never reads its answers, over real ZeroMQ on loopback.

The runtime must drop (and count) what such a peer cannot take instead of waiting on it, answer
its bad frames only up to a per-peer allowance, and go on serving everyone else. The hostile
peer is a raw pyzmq DEALER driven from a thread, as a foreign client would be.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgpack
import zmq

from troupe.runtime import Actor, Runtime, handles
from troupe.runtime.core.throttle import DEFAULT_BAD_FRAMES_BURST
from troupe.runtime.transports.zmq import ZmqTransport
from troupe.runtime.transports.zmq_outbox import ReplyOutbox

BOUND = 30.0
ASK, ERROR = 2, 4
BIG = "x" * 10_000  # replies big enough to fill the kernel's socket buffers quickly


class Echo(Actor):
    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload


@asynccontextmanager
async def served() -> AsyncIterator[tuple[Runtime, str]]:
    """A runtime with one echo actor (high-water mark 4); yields it and the actor's mailbox."""
    async with Runtime("n", "server", ZmqTransport(hwm=4), drain_timeout=0.1) as rt:
        await rt.spawn(Echo, "echo")
        yield rt, rt.cells["echo"].endpoint


def deaf_dealer(ctx: zmq.Context[Any], endpoint: str) -> zmq.Socket[bytes]:
    """A DEALER that will not read: tiny receive queue and kernel buffer."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # queue everything we send, never block on it
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(endpoint)
    return sock


def ask_frame(msg_id: int, payload: Any) -> bytes:
    return msgpack.packb(
        [1, ASK, msg_id, 0, "evil/py", "echo", "echo", time.time() + 60, None, None, payload]
    )


async def wait_until(predicate: Any, what: str) -> None:
    """A bounded poll of the runtime's counters."""
    with anyio.fail_after(BOUND):
        while not predicate():
            await anyio.sleep(0.01)


async def test_replies_to_a_peer_that_does_not_read_are_dropped_and_counted_while_others_are_served() -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        async with served() as (rt, endpoint):
            deaf = deaf_dealer(ctx, endpoint)
            try:
                n = 3000

                def flood() -> None:
                    for i in range(n):
                        deaf.send(ask_frame(i + 1, BIG))

                await anyio.to_thread.run_sync(flood)
                await wait_until(lambda: rt.statistics().actors["echo"]["handled"] >= n, "all asks handled")
                stats = rt.statistics()
                assert stats.actors["echo"]["replies_dropped"] > 0
                assert stats.replies_dropped == stats.actors["echo"]["replies_dropped"]
                # The same actor, from a peer that reads, while the deaf one is still connected.
                async with Runtime("n", "client", ZmqTransport(), drain_timeout=0.1) as client:
                    client.directory.learn("n/server/echo", endpoint)
                    ref = client.ref("n/server/echo")
                    assert [await ref.ask("echo", i, timeout=BOUND) for i in range(20)] == list(range(20))
            finally:
                deaf.close(0)
    finally:
        ctx.term()


async def test_bad_frames_are_answered_up_to_an_allowance_per_peer_then_the_peer_is_throttled() -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        async with served() as (rt, endpoint):
            flooder, polite = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
            for sock in (flooder, polite):
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 0)
                sock.connect(endpoint)
            try:
                n = 2000
                await anyio.to_thread.run_sync(lambda: [flooder.send(b"\xc1garbage") for _ in range(n)])
                stats = rt.statistics
                await wait_until(
                    lambda: stats().bad_frames + stats().dropped_from_throttled >= n, "every bad frame read"
                )
                # A burst of answered bad frames (a few refilled tokens at most), then the
                # throttle: the rest are dropped unread.
                assert stats().throttles >= 1
                answered = stats().bad_frames - stats().errors_suppressed
                assert DEFAULT_BAD_FRAMES_BURST <= answered < DEFAULT_BAD_FRAMES_BURST + 100
                assert stats().bad_frames + stats().dropped_from_throttled == n
                # Another peer's bad frame still earns its ERROR: the allowance is per peer.
                polite.send(b"\xc1garbage")
                assert await anyio.to_thread.run_sync(polite.poll, 10_000)
                header = msgpack.unpackb(polite.recv())
                assert header[1] == ERROR and header[10]["code"] == "bad_frame"
                # The flooder gets exactly the answers that were not suppressed.

                def drain() -> int:
                    got = 0
                    while flooder.poll(500):
                        assert msgpack.unpackb(flooder.recv())[1] == ERROR
                        got += 1
                    return got

                assert await anyio.to_thread.run_sync(drain) == answered
                assert rt.statistics().replies_dropped == 0
            finally:
                flooder.close(0)
                polite.close(0)
    finally:
        ctx.term()


class FakeSocket:
    """Stands in for a mailbox socket: refuses writes while ``full``, or fails with ``error``."""

    def __init__(self) -> None:
        self.full = True
        self.error: zmq.ZMQError | None = None
        self.sent: list[list[Any]] = []

    def write(self, _mailbox: Any, frames: list[Any]) -> None:
        if self.error is not None:
            raise self.error
        if self.full:
            raise zmq.Again()
        self.sent.append(frames)


def outbox(
    sock: FakeSocket, clock: Any, per_asker: int = 3, total: int = 5
) -> tuple[ReplyOutbox, list[tuple[bytes, str, int]]]:
    drops: list[tuple[bytes, str, int]] = []
    box = ReplyOutbox(
        sock.write,
        lambda _m, ident, exc, n: drops.append((ident, type(exc).__name__, n)),
        per_asker,
        total,
        linger_s=5.0,
        clock=clock,
    )
    return box, drops


async def wait_for(predicate: Any) -> None:
    with anyio.fail_after(BOUND):
        while not predicate():
            await anyio.sleep(0.001)


async def test_held_replies_leave_in_order_once_the_connection_takes_them() -> None:
    """A burst that outran the I/O thread: held, retried off the caller, delivered, none lost."""
    sock, now = FakeSocket(), [0.0]
    box, drops = outbox(sock, lambda: now[0])
    loop = asyncio.get_running_loop()
    mailbox: Any = object()
    assert all(box.hold(mailbox, b"a", [f"r{i}".encode()], loop) for i in range(3))
    assert box.holds(mailbox, b"a") and box.pending == 3
    sock.full = False
    await wait_for(lambda: box.pending == 0)
    assert sock.sent == [[b"a", b"r0"], [b"a", b"r1"], [b"a", b"r2"]]
    assert drops == [] and not box.holds(mailbox, b"a")


async def test_held_replies_are_dropped_after_the_linger_or_beyond_the_bounds() -> None:
    sock, now = FakeSocket(), [0.0]
    box, drops = outbox(sock, lambda: now[0])
    loop = asyncio.get_running_loop()
    mailbox: Any = object()
    assert [box.hold(mailbox, b"deaf", [b"r"], loop) for _ in range(4)] == [True, True, True, False]
    assert [box.hold(mailbox, b"other", [b"r"], loop) for _ in range(3)] == [True, True, False]  # total 5
    assert drops == [(b"deaf", "Again", 1), (b"other", "Again", 1)]
    now[0] = 5.0  # the asker has not read for the whole linger
    await wait_for(lambda: box.pending == 0)
    assert sorted(drops[2:]) == [(b"deaf", "Again", 3), (b"other", "Again", 2)]
    assert sock.sent == []


async def test_held_replies_to_an_asker_that_is_gone_are_dropped_at_the_next_retry() -> None:
    sock, now = FakeSocket(), [0.0]
    box, drops = outbox(sock, lambda: now[0])
    box.hold(object(), b"gone", [b"r"], asyncio.get_running_loop())
    sock.error = zmq.ZMQError(zmq.EHOSTUNREACH)
    await wait_for(lambda: box.pending == 0)
    assert drops == [(b"gone", "ZMQError", 1)]
