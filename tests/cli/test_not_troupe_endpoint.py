"""fh 2: a command pointed at an endpoint that is no troupe process (the node's own --metrics
port, any HTTP server) said the node there "runs, but is busy, paused (SIGSTOP) or hung; see its
log", sending the user to a healthy node's log. What listens there is now told by the first bytes
it sends a raw connection: a ZeroMQ peer greets at once, an HTTP server sends other bytes or none.

Real listeners on loopback, in this process: a server that speaks first (not ZeroMQ), one that
waits for a request (no greeting), and a ZeroMQ socket that never answers (a troupe process, hung).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import zmq

from support.port_range import test_endpoint
from troupe.cli.client import control
from troupe.cli.master_client import master_call
from troupe.cli.zmtp_greeting import Greeting, greeting
from troupe.runtime import AskTimeout, Unreachable

pytestmark = pytest.mark.anyio

ASK_S = 0.5  # the command's --timeout: the silence itself is not what is tested


def _listener(endpoint: str) -> socket.socket:
    parts = urlsplit(endpoint)
    sock = socket.create_server((parts.hostname or "127.0.0.1", parts.port or 0))
    sock.settimeout(0.1)
    return sock


@pytest.fixture
def http_server() -> Iterator[str]:
    """Answers every connection with an HTTP status line at once, then closes it."""
    endpoint = test_endpoint()
    stop = threading.Event()
    with _listener(endpoint) as sock:

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = sock.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield endpoint
        finally:
            stop.set()
            thread.join(timeout=10)


@pytest.fixture
def waiting_server() -> Iterator[str]:
    """Accepts connections (the kernel's backlog) and sends nothing: a server awaiting a request."""
    endpoint = test_endpoint()
    with _listener(endpoint):
        yield endpoint


@pytest.fixture
def hung_zmq_peer() -> Iterator[str]:
    """A ZeroMQ socket that completes every handshake and answers nothing: a hung troupe process."""
    endpoint = test_endpoint()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind(endpoint)
    try:
        yield endpoint
    finally:
        router.close()
        ctx.term()


def test_the_greeting_tells_zeromq_from_other_servers(
    http_server: str, waiting_server: str, hung_zmq_peer: str
) -> None:
    assert greeting(http_server) is Greeting.OTHER
    assert greeting(waiting_server, timeout=0.2) is Greeting.NONE
    assert greeting(hung_zmq_peer) is Greeting.ZMTP
    assert greeting("ipc:///tmp/none") is Greeting.UNKNOWN


async def test_a_server_that_speaks_first_is_said_to_be_no_troupe_node(http_server: str) -> None:
    # Unreachable where the server hung up on two handshakes before the ask's time was out (the
    # transport then fails the ask at once), AskTimeout otherwise: the same words either way.
    with pytest.raises((AskTimeout, Unreachable)) as caught:
        await control(http_server, "ping", timeout=ASK_S)
    assert str(caught.value) == (
        f"what listens at {http_server} answers, but is no troupe node: it does not speak ZeroMQ "
        "(an HTTP server? a node's --metrics port?); pass the node's endpoint"
    )


async def test_a_server_that_says_nothing_is_no_troupe_node_or_a_paused_one(waiting_server: str) -> None:
    with pytest.raises(AskTimeout) as caught:
        await master_call(waiting_server, "jobs", timeout=ASK_S)
    said = str(caught.value)
    assert said.startswith(
        f"what listens at {waiting_server} accepts connections, but sent no ZeroMQ greeting"
    )
    assert "no troupe master (an HTTP server? a node's --metrics port?), or a troupe process paused" in said


async def test_a_silent_zeromq_peer_is_still_said_to_be_busy_or_hung(hung_zmq_peer: str) -> None:
    with pytest.raises(AskTimeout) as caught:
        await control(hung_zmq_peer, "ping", timeout=ASK_S)
    said = str(caught.value)
    assert said.startswith(f"the node at {hung_zmq_peer} did not answer within {ASK_S}s: it accepts")
    assert "busy, paused (SIGSTOP) or hung" in said
