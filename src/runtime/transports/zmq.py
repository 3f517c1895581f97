"""The ZeroMQ transport: one ROUTER mailbox per process, one DEALER per peer.

Every process binds a ROUTER socket (its mailbox). To send to a peer it connects a DEALER to
the peer's ROUTER; replies come back on that DEALER, through the ROUTER identity of the
connection, so they never queue behind the asker's own mailbox.

Performance matters here and shapes the code:
- Sockets are plain (blocking) pyzmq sockets used with NOBLOCK, and the event loop watches
  each socket's file descriptor once (``add_reader``). The reader callback reads many messages
  per wake-up and hands each to the runtime's ``sync_handler``, which settles a reply or
  handles a message at once when that needs no waiting; only a message that must wait (a full
  mailbox, a control message) goes to the socket's pump task, which then reads in order.
- The ZeroMQ descriptor is edge-triggered: a send or a recv on the socket may consume the
  readiness edge. A reader therefore reads until the socket is empty, or looks at ``EVENTS``
  before it stops; a send made outside a read schedules one such look per loop turn.
- A reply never waits (``try_reply``): one that the asker's connection cannot take at once is
  held and retried off the reader, and dropped and counted if the asker does not read for
  ``REPLY_LINGER_S`` (or is gone), so no peer can stall a reader. Tells and asks to a full
  mailbox wait as before (backpressure).
- Replies and deliveries are sent with the compiled ``send`` and received as ``zmq.Frame`` (its
  ``more`` flag saves a getsockopt); buffer frames stay uncopied, header frames are copied.
- With keys (``security``), every socket authenticates and encrypts with CURVE: mailboxes are
  CURVE servers in the context that the process's authenticator guards (security.auth), and
  connections present the process's key pair and expect the cluster's server key. A mailbox's
  routes then carry the sender's user id (security.roles). Peers that fail the handshake are
  counted and logged (``zmq_handshakes``).

:class:`ZmqTransport` here is the transport itself: its mailboxes, serving its sockets, its
counters and its close. Its parts, each a base class that uses the transport's fields: ``zmq_receiving``
(reading a socket: the reader callback and the pump), ``zmq_sending`` (sending to a peer, the
batch frame of one loop turn, the look at ``EVENTS`` after a send), ``zmq_replies`` (answering
through a mailbox without waiting) and ``zmq_connections`` (the connection to each peer, and its
end). Below them: ``zmq_socket`` (the socket level: options, readiness, one message off a
socket), ``zmq_outbox`` (held replies), ``zmq_peer_loss`` (connections that end) and
``zmq_handshakes`` (failed handshakes). Only these modules import zmq.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio
import zmq

from troupe.runtime.core.peer_limits import PeerLogGate
from troupe.runtime.errors import Unreachable
from troupe.runtime.library_logging import get_logger
from troupe.runtime.security.auth import Gate, curve_server, gate_for, private_context
from troupe.runtime.security.keys import CurveKeys

from .base import OnMessage, TransportStats
from .ipc_socket import BoundSocketFile, bind_refusal, ipc_path
from .loopback import any_port
from .zmq_connections import ZmqConnections
from .zmq_handshakes import HandshakeWatch
from .zmq_outbox import ReplyOutbox
from .zmq_peer_loss import PeerLossWatch
from .zmq_receiving import ZmqReceiving
from .zmq_replies import DROP_LOG_INTERVAL_S, HELD_IN_ALL, HELD_PER_ASKER, REPLY_LINGER_S, ZmqReplies
from .zmq_sending import ZmqSending
from .zmq_socket import Watched, tune

__all__ = ["ZmqTransport"]

log = get_logger(__name__)


class ZmqTransport(ZmqConnections, ZmqSending, ZmqReceiving, ZmqReplies):
    """A transport over ZeroMQ TCP (or ipc) sockets.

    Args:
        bind: endpoint for the mailbox, e.g. ``tcp://127.0.0.1:*`` for a free port.
        hwm: high-water mark (messages) of every socket, in both directions; a full peer makes
            ``send`` wait (or raise MailboxFull with block=False).
        batch: messages handled per wake-up before yielding to other tasks.
        context: a zmq Context to share; a private one is made otherwise.
        batch_io_thread: run the private context's I/O thread under SCHED_BATCH (Linux); see
            ``security.auth.private_context``.
        max_message_bytes: the largest frame any socket takes (ZeroMQ's MAXMSGSIZE): libzmq
            drops the connection of a peer that sends a bigger one, before it is read into
            memory (the codec bounds whole messages). None: no limit.
        security: CURVE keys: every socket authenticates and encrypts, in the context of the
            process's authenticator for these keys (``context`` is then unused).
    """

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:*",
        hwm: int = 1000,
        batch: int = 256,
        context: zmq.Context[Any] | None = None,
        batch_io_thread: bool = True,
        max_message_bytes: int | None = None,
        security: CurveKeys | None = None,
    ) -> None:
        self.security = security
        self._gate: Gate | None = gate_for(security) if security is not None else None
        if self._gate is not None:
            context = self._gate.context  # shared by the process; never terminated here
        self._own_ctx = context is None
        self._ctx = context or private_context(batch_io_thread)
        self._handshakes = HandshakeWatch(self._gate)
        self._peer_loss = PeerLossWatch(
            self._connection_lost,
            self._connection_refused,
            server_key=security.directory / "cluster.key" if security is not None else None,
        )
        # Set by the runtime: told the address of a peer whose connection ended (its process
        # died or stopped) once the replies it sent first were handled (zmq_peer_loss.py).
        self.on_peer_lost: Callable[[str], None] | None = None
        # Told the endpoint of a peer whose CURVE handshake failed for keys, and why in words:
        # this process's key is not authorised there, or its server key is not the peer's
        # (zmq_peer_loss.py).
        self.on_peer_refused: Callable[[str, str], None] | None = None
        self.hwm = hwm
        self.batch = batch
        self.max_message_bytes = -1 if max_message_bytes is None else max_message_bytes
        self._mailboxes: list[Watched] = []
        # The socket files of its ipc mailboxes: removed at close (ZeroMQ leaves them).
        self._socket_files: list[BoundSocketFile] = []
        self._dealers: dict[str, Watched] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        # Actors' mailboxes listen on the interface the process's own mailbox binds: a worker
        # that other hosts reach has actors they reach too.
        self._mailbox_bind = any_port(bind)
        try:
            self.address: str = self.open_mailbox(bind)
        except Unreachable:
            if self._own_ctx:  # nobody else will: a transport that never was
                self._ctx.term()
            raise
        self._on_message: OnMessage | None = None
        # Set by the runtime: handles a message at once if it can do so without waiting
        # (a reply, a message to a mailbox with room) and returns whether it did.
        self.sync_handler: Callable[[Any, list[Any]], bool] | None = None
        # Fault injection (partition): when set, traffic to and replies from a peer it names
        # are refused; see refused_counts. None costs one attribute test per send.
        self.refuse: Callable[[str], bool] | None = None
        self._refused: dict[str, int] = {}
        self._replies_dropped = 0
        self._drop_log = PeerLogGate(DROP_LOG_INTERVAL_S)
        self._outbox = ReplyOutbox(
            self._write,
            self._reply_dropped,
            max(hwm, HELD_PER_ASKER),
            max(4 * hwm, HELD_IN_ALL),
            REPLY_LINGER_S,
        )
        self._sent = 0
        self._received = 0
        self._batches_sent = 0
        self._batches_received = 0
        # [sent, received] bytes of every frame, when someone asked (count_bytes); None costs
        # one attribute test per message.
        self.wire_bytes: list[int] | None = None
        self._closed = False

    def open_mailbox(self, bind: str | None = None) -> str:
        """Bind one more ROUTER mailbox (one per actor) and return its endpoint; ``bind``
        defaults to a free port on the interface of the transport's own mailbox.

        Each actor gets a mailbox socket of its own so that an actor whose mailbox is full
        pushes back on its own senders only (through the socket's high-water mark) and never
        stalls the other actors or the control messages of its process.

        Raises:
            Unreachable: the endpoint cannot be bound.
        """
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        tune(sock, bind or self._mailbox_bind, self.hwm, self.max_message_bytes)
        keys = self.security
        if keys is not None:
            curve_server(sock, keys)
        target = bind or self._mailbox_bind
        path = ipc_path(target)
        refused = bind_refusal(path) if path else None  # ZeroMQ unlinks what is there to bind
        if refused is not None:
            sock.close(0)
            raise Unreachable(f"cannot bind a mailbox at {bind}: {refused}")
        try:
            sock.bind(target)
        except zmq.ZMQError as exc:
            sock.close(0)
            refusal = Unreachable(f"cannot bind a mailbox at {bind}: {exc.strerror}")
            refusal.errno = exc.errno  # an address in use is said apart (the node's start)
            raise refusal from exc
        if path and (bound := BoundSocketFile.of(target)) is not None:
            self._socket_files.append(bound)
        w = Watched(sock, sock.getsockopt_string(zmq.LAST_ENDPOINT), is_router=True, curve=keys is not None)
        if keys is not None:
            self._handshakes.watch(sock, w.peer)
        self._mailboxes.append(w)
        self._serve_socket(w)
        return w.peer

    def statistics(self) -> TransportStats:
        """Return counters."""
        return TransportStats(
            self.address,
            self._sent,
            self._received,
            len(self._dealers),
            self._replies_dropped,
            self._batches_sent,
            self._batches_received,
            sum(len(w.out) for w in self._dealers.values()),
        )

    async def serve(self, on_message: OnMessage, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Receive on the mailbox and on every peer connection until cancelled."""
        self._loop = asyncio.get_running_loop()
        self._on_message = on_message
        self._handshakes.serve(self._loop)
        self._peer_loss.serve(self._loop)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for w in [*self._mailboxes, *self._dealers.values()]:
                    self._serve_socket(w)
                task_status.started()
        finally:
            self._tg = None
            self._unwatch_all()

    def _serve_socket(self, w: Watched) -> None:
        """Watch the socket's descriptor and start its pump, once the transport serves."""
        if self._tg is None or self._loop is None:
            return  # ``serve`` does it for every socket when it starts
        self._loop.add_reader(w.fd, self._readable, w)
        self._tg.start_soon(self._pump, w)

    def _unwatch_all(self) -> None:
        self._handshakes.unwatch()
        self._peer_loss.unwatch()
        if self._loop is None or self._loop.is_closed():
            return
        for w in [*self._mailboxes, *self._dealers.values()]:
            try:
                self._loop.remove_reader(w.fd)
            except (ValueError, OSError):
                pass

    def waiting(self) -> int:
        """Messages read off the mailboxes but not yet handed on (their pumps' backlogs).

        Safe to call from another thread (the heartbeat's): it only reads lengths.
        """
        return sum(len(w.backlog) for w in list(self._mailboxes))

    @property
    def refused_counts(self) -> dict[str, int]:
        """Messages refused per peer while partitioned (sends and replies dropped)."""
        return dict(self._refused)

    def _count_refused(self, peer: str, direction: str) -> None:
        n = self._refused.get(peer, 0)
        self._refused[peer] = n + 1
        if n == 0:  # once per peer: a partition must be visible, not flood the log
            log.warning("partition_refused", peer=peer, direction=direction)

    def close(self) -> None:
        """Close every socket at once (linger 0)."""
        if self._closed:
            return
        self._closed = True
        for w in self._dealers.values():  # what this turn's sends left for its end, if it can
            if w.out_retry is not None:
                w.out_retry.cancel()
            if w.out:
                self._flush_out(w)
        self._outbox.close()
        self._unwatch_all()
        self._handshakes.close()
        self._peer_loss.close()
        for w in self._dealers.values():
            w.sock.close(0)
        self._dealers.clear()
        for w in self._mailboxes:
            w.sock.close(0)
        for bound in self._socket_files:
            bound.remove()
        if self._own_ctx:
            self._ctx.term()
