"""An ask whose peer's connection ends before the reply (zmq_peer_loss.py): PeerLost then,
not at its deadline; a reply that came before the end is still the ask's answer; a
connection that never completed its handshake is no loss.

The asked process is a raw ROUTER here, so that the test decides when it answers and when its
connection ends.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import pytest
import zmq

from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.errors import AskTimeout, PeerLost
from troupe.runtime.wire.codec import Codec

HANG_S = 3600.0  # an ask's timeout that no test waits out
WITHIN_S = 30.0  # a bound on a hang, not on speed


class Peer:
    """A raw ROUTER standing in for the asked process, on a context of its own."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"

    def receive(self) -> tuple[bytes, int]:
        """The asker's identity and the ask's id, once it arrives (bounded)."""
        assert self.sock.poll(int(WITHIN_S * 1000)), "the ask never arrived"
        identity, *frames = self.sock.recv_multipart()
        return identity, Codec().decode(frames).msg_id

    def answer(self, identity: bytes, msg_id: int, payload: Any) -> None:
        self.sock.send_multipart([identity, *Codec().encode_reply(msg_id, "n/peer", payload)])

    def die(self) -> None:
        """What the process's death does to its connections: they close."""
        if not self.ctx.closed:
            self.sock.close(0)
            self.ctx.term()


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    try:
        yield p
    finally:
        p.die()


@asynccontextmanager
async def asker() -> AsyncIterator[Runtime]:
    async with process_runtime("n", "asker") as rt:
        yield rt


def _ask(rt: Runtime, peer: Peer, msg_type: str) -> Any:
    rt.directory.learn("n/peer/actor", peer.endpoint)
    return rt.ref("n/peer/actor").ask(msg_type, None, timeout=HANG_S)


async def test_an_ask_ends_with_peer_lost_when_the_asked_process_goes(peer: Peer) -> None:
    async with asker() as rt:
        ended: list[BaseException] = []

        async def ask() -> None:
            try:
                await _ask(rt, peer, "work")
            except AskTimeout as exc:
                ended.append(exc)

        with anyio.fail_after(WITHIN_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await anyio.to_thread.run_sync(peer.receive)
                peer.die()
        assert len(ended) == 1 and isinstance(ended[0], PeerLost), (
            ended
        )  # code that handles timeouts handles it
        said = str(ended[0])
        assert "ask 'work' to n/peer/actor" in said and peer.endpoint in said, said
        assert rt.statistics().pending_asks == 0


async def test_a_reply_that_came_before_the_end_is_the_answer(peer: Peer) -> None:
    """The end of the connection may be read before the reply that preceded it: the reply
    still answers the ask."""
    async with asker() as rt:
        with anyio.fail_after(WITHIN_S):
            async with anyio.create_task_group() as tg:
                answers: list[Any] = []

                async def ask() -> None:
                    answers.append(await _ask(rt, peer, "work"))

                tg.start_soon(ask)
                identity, msg_id = await anyio.to_thread.run_sync(peer.receive)
                peer.answer(identity, msg_id, "done")
                transport: Any = rt.transport
                connection = transport._dealers[peer.endpoint]
                # Wait here, the loop held, for the reply to reach the connection's socket: the
                # poll takes its descriptor's signal, so only the loss below will read it.
                assert connection.sock.poll(int(WITHIN_S * 1000))
                transport._connection_lost(connection)  # as when the monitor's event is read first
        assert answers == ["done"]


@contextmanager
def hangs_up_at_once() -> Iterator[str]:
    """A TCP port that accepts each connection and closes it: no handshake ever completes."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=WITHIN_S)
        server.close()


async def test_a_connection_that_never_completed_its_handshake_is_no_loss() -> None:
    with hangs_up_at_once() as endpoint:
        async with asker() as rt:
            rt.directory.learn("n/peer/actor", endpoint)
            with anyio.fail_after(WITHIN_S), pytest.raises(AskTimeout) as timed_out:
                await rt.ref("n/peer/actor").ask("work", None, timeout=1.0)
            assert not isinstance(timed_out.value, PeerLost), timed_out.value
