"""A TCP connection from before a link cut is dropped, not waited on behind the kernel's
retransmission backoff: every socket of the transport bounds how long sent data may stay
unacknowledged (ZMQ_TCP_MAXRT, TCP_USER_TIMEOUT on Linux)."""

from __future__ import annotations

import zmq

from troupe.runtime.transports.zmq import ZmqTransport
from troupe.runtime.transports.zmq_socket import TCP_UNACKED_TIMEOUT_MS


async def test_mailboxes_and_connections_drop_data_unacknowledged_too_long() -> None:
    server = ZmqTransport()
    client = ZmqTransport()
    try:
        mailbox = server.open_mailbox()
        await client.send(mailbox, [b"hello"], block=False)
        sockets = [*server._mailboxes, *client._dealers.values()]
        assert len(sockets) >= 2 and client._dealers
        assert {w.sock.getsockopt(zmq.TCP_MAXRT) for w in sockets} == {TCP_UNACKED_TIMEOUT_MS}
        assert 0 < TCP_UNACKED_TIMEOUT_MS <= 30_000  # well before the backoff's two minutes
    finally:
        client.close()
        server.close()
