"""Messages to one peer made within one turn of the loop travel as batch frames (wire/batch_frames.py).

What a user relies on: every message arrives once and in order, every ask gets its own answer,
a peer that cannot take a batch gets it later rather than never, a client that never batches
never receives a batch, and a broken batch is a bad frame like any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import zmq

from support.echo_process import Echoer, echo_process
from troupe.runtime import Actor, MailboxFull, Runtime, handles
from troupe.runtime.transports.zmq import ZmqTransport
from troupe.runtime.wire.batch_frames import BATCH_MARK, pack_batch, unpack_batch
from troupe.runtime.wire.codec import Codec, Envelope, Kind

BOUND = 10.0
NODE = "n"
PADDING = b"x" * 1000  # fills the buffers between the two in a few thousand messages


class Keeper(Actor):
    """Records tells in order; echoes; can be held up (its tells then queue)."""

    mailbox_capacity = 4

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.open = anyio.Event()
        self.open.set()

    @handles("rec")
    async def rec(self, item: Any) -> None:
        await self.open.wait()
        self.seen.append(item[0] if isinstance(item, list) else item)

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload

    @handles("count")
    def count(self, _: Any) -> int:
        return len(self.seen)


@asynccontextmanager
async def _pair(hwm: int = 1000) -> AsyncIterator[tuple[Runtime, Runtime, Keeper]]:
    ta = ZmqTransport("tcp://127.0.0.1:*", hwm=hwm)
    tb = ZmqTransport("tcp://127.0.0.1:*", hwm=hwm)
    async with Runtime(NODE, "a", ta, ask_timeout=BOUND) as a, Runtime(NODE, "b", tb, drain_timeout=0.5) as b:
        keeper = Keeper()
        await b.spawn(keeper, "keeper")
        await b.spawn(Echoer, "echoer")
        while not b.cells["echoer"].idle():
            await anyio.lowlevel.checkpoint()
        a.directory.learn(f"{NODE}/b/keeper", b.cells["keeper"].endpoint)
        yield a, b, keeper


def _stats(rt: Runtime) -> Any:
    transport = rt.transport
    assert isinstance(transport, ZmqTransport)
    return transport.statistics()


async def test_asks_in_flight_leave_in_batches_and_each_gets_its_own_answer() -> None:
    with anyio.fail_after(BOUND):
        async with _pair() as (a, b, _):
            a.directory.learn(f"{NODE}/b/echoer", b.cells["echoer"].endpoint)
            ref = a.ref(f"{NODE}/b/echoer")
            answers: dict[tuple[int, int], Any] = {}

            async def asker(task: int) -> None:
                for i in range(50):
                    answers[task, i] = await ref.ask("echo", [task, i])

            async with anyio.create_task_group() as tg:
                for task in range(64):
                    tg.start_soon(asker, task)
            sent, replied = _stats(a), _stats(b)
    assert answers == {(t, i): [t, i] for t in range(64) for i in range(50)}
    assert sent.batches_sent > 0 and replied.batches_received > 0
    assert replied.batches_sent > 0 and sent.batches_received > 0  # it answered in batches too
    # Each message is counted once, batched or not.
    assert sent.sent == replied.received == 64 * 50


async def test_tells_made_in_one_turn_arrive_once_and_in_order() -> None:
    with anyio.fail_after(BOUND):
        async with _pair() as (a, b, keeper):
            ref = a.ref(f"{NODE}/b/keeper")
            await ref.ask("echo", 0)  # connected, and its reader waiting for input
            for i in range(500):
                await ref.tell("rec", i)  # no wait between them: one turn of the loop
            while await ref.ask("count") < 500:
                await anyio.sleep(0.01)
            assert _stats(b).batches_received > 0
    assert keeper.seen == list(range(500))


async def test_tells_that_returned_all_arrive_when_the_peer_takes_them_again() -> None:
    """A peer that stops reading fills up; what the sender was told it sent (a batch held for
    the peer that could not take it among it) arrives, in order, once the peer reads again."""
    with anyio.fail_after(BOUND):
        async with _pair(hwm=8) as (a, _b, keeper):
            ref = a.ref(f"{NODE}/b/keeper")
            await ref.ask("echo", 0)
            keeper.open = anyio.Event()  # held: its mailbox, its sockets, then TCP's buffers fill
            accepted = 0
            while True:
                try:
                    await ref.tell("rec", [accepted, PADDING], block=False)
                except MailboxFull:
                    break
                accepted += 1  # no turn ends meanwhile: every tell after the first is batched
            held = _stats(a).batched_waiting
            keeper.open.set()
            while len(keeper.seen) < accepted:
                await anyio.sleep(0.01)
            assert _stats(a).batched_waiting == 0
            # And the connection still serves.
            assert await ref.ask("echo", "after") == "after"
    assert held > 0  # the case this test is for: a batch the peer could not take yet
    assert keeper.seen == list(range(accepted))


@pytest.mark.parametrize("window", [1, 4, 8, 16, 64])
async def test_asks_to_another_process_all_get_their_answer(window: int) -> None:
    """Each side sends while the other reads (two processes): a batch of replies sent after
    the reader found its socket empty must not hide the asks that came meanwhile (they waited
    unread until the asker gave up)."""
    with echo_process() as endpoint, anyio.fail_after(4 * BOUND):
        async with Runtime(NODE, "a", ZmqTransport("tcp://127.0.0.1:*"), ask_timeout=BOUND) as a:
            a.directory.learn(f"{NODE}/echo/echoer", endpoint)
            ref = a.ref(f"{NODE}/echo/echoer")
            answered = 0

            async def asker(task: int) -> None:
                nonlocal answered
                for i in range(3000 // window):
                    assert await ref.ask("echo", [task, i]) == [task, i]
                    answered += 1

            async with anyio.create_task_group() as tg:
                for task in range(window):
                    tg.start_soon(asker, task)
    assert answered == 3000 // window * window


def _ask_frames(msg_id: int, payload: Any) -> bytes:
    env = Envelope(Kind.ASK, msg_id, 0, "raw", "echoer", "echo", None, None, None, payload)
    frames = Codec().encode(env)
    assert len(frames) == 1
    return bytes(frames[0])


def _read(sock: zmq.Socket[bytes], n: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < n:
        if not sock.poll(int(BOUND * 1000)):
            raise AssertionError(f"only {len(got)} of {n} replies within {BOUND} s")
        got.append(sock.recv())
    return got


async def _raw_client(endpoint: str) -> tuple[zmq.Context[Any], zmq.Socket[bytes]]:
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return ctx, sock


async def test_a_client_that_never_batches_gets_no_batch() -> None:
    """A plain DEALER that sends many asks at once (PROTOCOL.md's raw client) gets one reply
    per frame: a mailbox batches its answers only to a connection that batched to it."""
    with anyio.fail_after(BOUND):
        async with _pair() as (_a, b, _):
            ctx, sock = await _raw_client(b.cells["echoer"].endpoint)
            try:
                for i in range(1, 201):
                    sock.send(_ask_frames(i, i))
                frames = await anyio.to_thread.run_sync(_read, sock, 200)
            finally:
                sock.close(0)
                ctx.term()
    assert not any(f[:1] == BATCH_MARK for f in frames)
    codec = Codec()
    assert sorted(codec.decode([f]).payload for f in frames) == list(range(1, 201))


async def test_a_broken_batch_is_a_bad_frame_and_a_good_one_is_answered() -> None:
    with anyio.fail_after(BOUND):
        async with _pair() as (_a, b, _):
            ctx, sock = await _raw_client(b.cells["echoer"].endpoint)
            codec = Codec()
            try:
                sock.send(BATCH_MARK + b"\xff\x00\x00\x00abc")  # a length past its end
                (broken,) = await anyio.to_thread.run_sync(_read, sock, 1)
                # A good batch, with a batch inside it (refused alone) between two asks.
                sock.send(
                    pack_batch(
                        [_ask_frames(1, "one"), pack_batch([_ask_frames(2, "x")]), _ask_frames(3, "three")]
                    )
                )
                frames = await anyio.to_thread.run_sync(_read, sock, 1)
                # It batched to this mailbox: the answers may come as one batch, or several.
                replies: list[Envelope] = []
                while True:
                    for frame in frames:
                        if frame[:1] == BATCH_MARK:
                            inner = unpack_batch(frame)
                            assert inner is not None
                            replies.extend(codec.decode([h]) for h in inner)
                        else:
                            replies.append(codec.decode([frame]))
                    if len(replies) >= 3:
                        break
                    frames = await anyio.to_thread.run_sync(_read, sock, 1)
            finally:
                sock.close(0)
                ctx.term()
            assert b.statistics().bad_frames == 2
    error = codec.decode([broken])
    assert error.kind is Kind.ERROR and error.payload["code"] == "bad_frame"
    by_kind = sorted(
        (r.kind, r.corr_id, r.payload if r.kind is Kind.REPLY else r.payload["code"]) for r in replies
    )
    assert by_kind == [(Kind.REPLY, 1, "one"), (Kind.REPLY, 3, "three"), (Kind.ERROR, 0, "bad_frame")]
