"""The socket level of the ZeroMQ transport: options, one socket with its readiness state,
taking one message off a socket, and a message's bytes. The transport's modules (``zmq`` and its
parts) import zmq; its context is made by ``security.auth.private_context``, the CURVE gate's
with it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, cast

import zmq

from troupe.runtime.library_logging import get_logger

__all__ = [
    "COPY_BELOW",
    "EVENTS",
    "NOBLOCK",
    "POLLIN",
    "POLLOUT",
    "SNDMORE",
    "TCP_UNACKED_TIMEOUT_MS",
    "Watched",
    "frames_bytes",
    "recv_frame",
    "recv_one",
    "recv_rest",
    "send_frame",
    "socket_events",
    "tune",
    "user_id",
]

log = get_logger(__name__)

# Plain ints: pyzmq's enum members cost microseconds per operation on the hot path.
POLLIN = int(zmq.POLLIN)
POLLOUT = int(zmq.POLLOUT)
NOBLOCK = int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)
EVENTS = int(zmq.EVENTS)
# Frames below this size are copied into ZeroMQ (cheaper than pinning a Python buffer).
COPY_BELOW = 64 * 1024
# The compiled send and recv, without the pure-Python wrappers of zmq.Socket (routing ids and
# groups of draft sockets, which troupe does not use): a third of a microsecond per call.
send_frame = zmq.backend.Socket.send
recv_frame = zmq.backend.Socket.recv
# A TCP connection whose sent data stays unacknowledged this long is dropped, and a DEALER
# connects anew (ZMQ_TCP_MAXRT: TCP_USER_TIMEOUT on Linux). Without it, after a link cut longer
# than the node timeout, messages waited on the connection from before the cut behind the
# kernel's doubling retransmission backoff (up to 2 minutes; the master's replies to a node's
# worker among them) instead of a new connection. The peer's kernel acknowledges whatever its
# process is doing (a busy or full mailbox included), so only a dead link or host reaches it;
# ZeroMQ heartbeats were not used because a mailbox pushing back stops reading its socket,
# heartbeats included, and would drop healthy connections.
TCP_UNACKED_TIMEOUT_MS = 20_000


def tune(sock: zmq.Socket[bytes], endpoint: str, hwm: int, max_message_bytes: int) -> None:
    """Set the options every socket of the transport has, mailbox or connection: ``hwm``
    messages queued each way, no linger, frames up to ``max_message_bytes`` (-1: any size)."""
    if endpoint.startswith("tcp://["):  # ZeroMQ binds and connects IPv6 only when told to
        sock.setsockopt(zmq.IPV6, 1)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.TCP_MAXRT, TCP_UNACKED_TIMEOUT_MS)


class Watched:
    """A socket with its readiness flag, fed by the loop's reader callback."""

    __slots__ = (
        "backlog",
        "batchers",
        "curve",
        "draining",
        "fd",
        "is_router",
        "out",
        "out_bytes",
        "out_delay",
        "out_retry",
        "peer",
        "recheck",
        "replies",
        "replies_dropped",
        "senders",
        "sent_before_look",
        "sock",
        "waiting",
        "wake",
        "writable",
    )

    def __init__(self, sock: zmq.Socket[bytes], peer: str, is_router: bool, curve: bool = False) -> None:
        self.sock = sock
        self.fd = sock.fileno()  # the FD option, as an int
        self.wake = asyncio.Event()  # the reader (pump) waits on this
        self.writable = asyncio.Event()  # senders blocked at the high-water mark wait on this
        self.peer = peer
        self.waiting = False  # the pump is parked on ``wake``
        self.is_router = is_router  # a mailbox (messages come with a route) or a peer connection
        self.senders = 0  # sends parked on ``writable`` until the socket takes messages again
        self.recheck = False  # a post-send look at EVENTS is scheduled
        # The reader callback is draining the socket: it reads until the socket has nothing
        # left, after any send made meanwhile, so such a send needs no look at EVENTS.
        self.draining = False
        # Messages the reader callback took off the socket but could not handle at once;
        # the pump handles them first, in order, before it reads the socket again.
        self.backlog: deque[tuple[Any, list[Any]]] = deque()
        self.replies_dropped = 0  # a mailbox's replies its askers could not take (never waited on)
        # A CURVE server socket: each message's route also carries the sender's User-Id.
        self.curve = curve and is_router
        # Headers sent in this turn of the loop after its first send, leaving together as one
        # batch frame (wire/batch_frames.py) when the look at EVENTS scheduled after that send runs; and
        # the retry of a batch the peer could not take.
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.out_retry: asyncio.TimerHandle | None = None
        self.out_delay = 0.0
        self.sent_before_look = False  # a send went at once since the look was scheduled
        # A mailbox's replies made while its reader drains, per asker that sent it batches
        # (``batchers``; only those read batches), sent together when the drain ends.
        self.replies: dict[bytes, list[bytes]] = {}
        self.batchers: set[bytes] = set()


def socket_events(sock: zmq.Socket[bytes]) -> int:
    """The socket's ``EVENTS`` bits (``POLLIN``, ``POLLOUT``); pyzmq types every option's value
    as ``int | bytes``, and this one is an int."""
    return cast(int, sock.getsockopt(EVENTS))


def user_id(frame: zmq.Frame) -> str:
    """The ``User-Id`` the authenticator gave the sender of ``frame`` (CURVE server sockets)."""
    try:
        return str(frame.get("User-Id"))
    except zmq.ZMQError:  # not set: only a handshake ZAP approved lets a message through
        return "unknown"


def recv_one(w: Watched) -> tuple[Any, list[Any]]:
    """Take one message off the socket: ``(route, frames)``; zmq.Again when there is none.

    A mailbox's route is ``(socket, asker identity)``, with CURVE ``(socket, asker identity,
    asker's User-Id)`` (security.roles reads it); a peer connection's is None.
    """
    sock = w.sock
    if w.is_router:
        route: Any = (w, recv_frame(sock, NOBLOCK))
    else:
        route = None
    # A zmq.Frame knows whether more frames follow, which is cheaper than asking the socket
    # (getsockopt); the header is copied out of it, buffer frames are kept without copies.
    frame = recv_frame(sock, NOBLOCK, False)
    if w.curve:
        route = (w, route[1], user_id(frame))
    frames: list[Any] = [frame.bytes]
    if frame.more:
        recv_rest(sock, frames)
    return route, frames


def recv_rest(sock: zmq.Socket[bytes], frames: list[Any]) -> None:
    """Append to ``frames`` the buffer frames that follow a header, as ``zmq.Frame`` objects
    (uncopied) until the last."""
    while True:
        frame = recv_frame(sock, NOBLOCK, False)
        frames.append(frame)
        if not frame.more:
            return


def frames_bytes(frames: list[Any]) -> int:
    """The bytes of a message's frames (bytes, zmq frames, buffers of arrays or tensors)."""
    total = 0
    for frame in frames:
        nbytes = getattr(frame, "nbytes", None)
        total += nbytes if isinstance(nbytes, int) else len(frame)
    return total
