"""An ask whose peer's connection ends before the reply (zmq_peer_loss.py): PeerLost then,
not at its deadline; a reply that came before the end is still the ask's answer; a
connection that never completed its handshake is no loss.

The asked process is a raw ROUTER here (support/raw_peer.py), so that the test decides when it
answers and when its connection ends.
"""

from __future__ import annotations

import resource
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.raw_peer import WITHIN_S, RawPeer, goes_mid_call
from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.errors import AskTimeout, PeerLost, Unreachable

HANG_S = 3600.0  # an ask's timeout that no test waits out


@asynccontextmanager
async def asker() -> AsyncIterator[Runtime]:
    async with process_runtime("n", "asker") as rt:
        yield rt


def _ask(rt: Runtime, peer: RawPeer, msg_type: str) -> Any:
    rt.directory.learn("n/peer/actor", peer.endpoint)
    return rt.ref("n/peer/actor").ask(msg_type, None, timeout=HANG_S)


async def test_an_ask_ends_with_peer_lost_when_the_asked_process_goes() -> None:
    with RawPeer() as peer:
        async with asker() as rt:
            ended = await goes_mid_call(peer, lambda: _ask(rt, peer, "work"))
            assert rt.statistics().pending_asks == 0
    assert isinstance(ended, PeerLost), ended  # an AskTimeout: code that handles timeouts handles it
    said = str(ended)
    assert "ask 'work' to n/peer/actor" in said and peer.endpoint in said, said


async def test_a_reply_that_came_before_the_end_is_the_answer() -> None:
    """The end of the connection may be read before the reply that preceded it: the reply
    still answers the ask."""
    answers: list[Any] = []
    with RawPeer() as peer:
        async with asker() as rt:

            async def ask() -> None:
                answers.append(await _ask(rt, peer, "work"))

            with anyio.fail_after(WITHIN_S):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ask)
                    identity, msg_id = await anyio.to_thread.run_sync(peer.receive)
                    peer.answer(identity, msg_id, "done")
                    transport: Any = rt.transport
                    connection = transport._dealers[peer.endpoint]
                    # Wait here, the loop held, for the reply to reach the connection's socket:
                    # the poll takes its descriptor's signal, so only the loss below reads it.
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
    """Nothing was delivered: not PeerLost (whether it was handled is no question). Hang-ups in
    a row end the ask saying what may hang up so (zmq_peer_loss.py); one alone waits."""
    with hangs_up_at_once() as endpoint:
        async with asker() as rt:
            rt.directory.learn("n/peer/actor", endpoint)
            with anyio.fail_after(WITHIN_S), pytest.raises((AskTimeout, Unreachable)) as ended:
                await rt.ref("n/peer/actor").ask("work", None, timeout=HANG_S)
            assert isinstance(ended.value, Unreachable), ended.value
            assert "hung up on every handshake" in str(ended.value), ended.value


async def test_a_transport_keeps_hundreds_of_watched_peer_connections(tmp_path: Path) -> None:
    """Each connection takes three sockets with its monitor; ZeroMQ's default of 1,023 sockets a
    context would have stopped a process at about 340 peers (a master tells each worker's
    process of its leases)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    peers = min(400, (soft - 256) // 4)  # within this process's file limit, whatever it is
    async with asker() as rt:
        transport: Any = rt.transport
        for i in range(peers):  # nobody listens there: each connection waits, as for a peer not up yet
            assert transport.try_send(f"ipc://{tmp_path}/peer-{i}", [b"x"])
        assert transport.statistics().peers == peers
