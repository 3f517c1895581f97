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
Only this module, ``zmq_socket`` (the socket level), ``zmq_outbox`` (held replies) and
``zmq_handshakes`` (failed handshakes) import zmq.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from typing import Any

import anyio
import zmq

from troupe.runtime.core.peer_limits import PeerLogGate
from troupe.runtime.errors import MailboxFull, Partitioned, Unreachable
from troupe.runtime.library_logging import get_logger
from troupe.runtime.security.auth import Gate, curve_client, curve_server, gate_for, private_context
from troupe.runtime.security.keys import CurveKeys
from troupe.runtime.wire.batch_frames import (
    BATCH_MARK,
    MAX_BATCH_BYTES,
    MAX_BATCH_MESSAGES,
    batch_frames,
    pack_batch,
    unpack_batch,
)

from .base import OnMessage, TransportStats
from .ipc_socket import BoundSocketFile, bind_refusal, ipc_path
from .loopback import any_port
from .zmq_handshakes import HandshakeWatch
from .zmq_outbox import FIRST_RETRY_S, MAX_RETRY_S, ReplyOutbox
from .zmq_peer_loss import PeerLossWatch
from .zmq_socket import (
    COPY_BELOW,
    NOBLOCK,
    POLLIN,
    POLLOUT,
    SNDMORE,
    Watched,
    recv_one,
    send_frame,
    socket_events,
)

__all__ = ["ZmqTransport"]


def _no_room(exc: zmq.ZMQError) -> str:
    """Why a connection could not be opened, with what to do when descriptors ran out."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return f"{exc.strerror} (this process is out of file descriptors: raise its limit, ulimit -n)"
    return str(exc.strerror)


log = get_logger(__name__)

# A peer whose replies are dropped gets one log line per this many seconds, whatever the rate.
DROP_LOG_INTERVAL_S = 10.0
# How long replies an asker's connection cannot take are retried before they are dropped.
REPLY_LINGER_S = 5.0
# Askers a mailbox remembers as reading batches; past this it forgets them all (they batch
# again, and are remembered again, at their next batch).
MAX_BATCHERS = 65_536
# Replies held for retries, at least (the high-water mark may be set lower): for one asker, and
# for all together. They bound memory while an asker does not read; bursts must fit.
HELD_PER_ASKER = 1000
HELD_IN_ALL = 10_000
# A TCP connection whose sent data stays unacknowledged this long is dropped, and a DEALER
# connects anew (ZMQ_TCP_MAXRT: TCP_USER_TIMEOUT on Linux). Without it, after a link cut longer
# than the node timeout, messages waited on the connection from before the cut behind the
# kernel's doubling retransmission backoff (up to 2 minutes; the master's replies to a node's
# worker among them) instead of a new connection. The peer's kernel acknowledges whatever its
# process is doing (a busy or full mailbox included), so only a dead link or host reaches it;
# ZeroMQ heartbeats were not used because a mailbox pushing back stops reading its socket,
# heartbeats included, and would drop healthy connections.
TCP_UNACKED_TIMEOUT_MS = 20_000


def frames_bytes(frames: list[Any]) -> int:
    """The bytes of a message's frames (bytes, zmq frames, buffers of arrays or tensors)."""
    total = 0
    for frame in frames:
        nbytes = getattr(frame, "nbytes", None)
        total += nbytes if isinstance(nbytes, int) else len(frame)
    return total


class ZmqTransport:
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
        self._tune(sock, bind or self._mailbox_bind)
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

    def _tune(self, sock: zmq.Socket[bytes], endpoint: str) -> None:
        if endpoint.startswith("tcp://["):  # ZeroMQ binds and connects IPv6 only when told to
            sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.SNDHWM, self.hwm)
        sock.setsockopt(zmq.RCVHWM, self.hwm)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.TCP_MAXRT, TCP_UNACKED_TIMEOUT_MS)

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

    def _readable(self, w: Watched) -> None:
        """The socket's descriptor fired: handle the first message at once, then look for more.

        On a peer connection, handling one reply and then yielding lets the task it woke send
        its next message before this reader looks whether more is waiting (a syscall, a
        microsecond or two): off the critical path of a lone ask.
        """
        self._read(w, 1)

    def _read(self, w: Watched, limit: int) -> None:
        """With the pump parked, read here and hand each message to the sync handler: a reply
        or a delivery then costs no task wake-up. The first message that needs waiting goes to
        the backlog, and the pump takes over from it, in order. Reads until the socket is
        empty, or up to ``limit`` messages and then looks again after the tasks they woke; that
        look also serves the sends made meanwhile (see ``_write``)."""
        w.recheck = False
        w.sent_before_look = False
        if w.senders:
            w.writable.set()  # any activity: a parked sender re-checks whether it may send
        handler = self.sync_handler
        if handler is None or w.backlog or not w.waiting:
            w.wake.set()
            return
        w.draining = True
        replied = False
        try:
            more = self._drain(w, handler, limit)
        finally:
            if w.replies:  # the replies made meanwhile, batched per asker
                replied = True
                self._flush_replies(w)
            w.draining = False
        if replied and not more:
            # Sent after the read that found the socket empty, they may have taken the signal
            # of input that came meanwhile: look, as the drain's own reads would have.
            more = bool(socket_events(w.sock) & POLLIN)
        if not more:
            return
        # Whether more is waiting, EVENTS says for less than a read that finds nothing. A
        # mailbox looks at once: what it handled is answered already. A peer connection looks
        # after the tasks its replies woke have run, so their sends leave first.
        if w.is_router and limit == 1:
            self._recheck(w)
            return
        assert self._loop is not None
        w.recheck = True
        self._loop.call_soon(self._recheck, w)

    def _drain(self, w: Watched, handler: Callable[[Any, list[Any]], bool], limit: int) -> bool:
        """Read up to ``limit`` messages; True when the limit stopped it (more may wait)."""
        is_router = w.is_router
        for _ in range(limit):
            try:
                route, frames = recv_one(w)
            except zmq.Again:
                if w.senders:
                    w.writable.set()  # our reads may have taken their signal: they look again
                return False
            except zmq.ZMQError:
                w.wake.set()  # the pump reports it (or sees the socket closed)
                return False
            self._received += 1
            if self.wire_bytes is not None:
                self.wire_bytes[1] += frames_bytes(frames)
            if not is_router and self.refuse is not None and self.refuse(w.peer):
                self._count_refused(w.peer, "receive")
                continue
            if len(frames) == 1 and frames[0][:1] == BATCH_MARK:
                headers = self._unbatch(w, route, frames[0])
                if headers is not None:
                    for i, header in enumerate(headers):
                        if not handler(route, [header]):
                            w.backlog.extend((route, [rest]) for rest in headers[i:])
                            w.wake.set()
                            return False
                    continue
            if not handler(route, frames):
                w.backlog.append((route, frames))
                w.wake.set()
                return False
        return True

    def _unbatch(self, w: Watched, route: Any, frame: bytes) -> list[bytes] | None:
        """The messages of a batch frame, counted; None when it is malformed (it then goes on
        as one message, which the codec refuses as a bad frame). A mailbox remembers that the
        asker reads batches."""
        headers = unpack_batch(frame)
        if headers is None:
            return None
        self._received += len(headers) - 1
        self._batches_received += 1
        if route is not None:
            batchers = w.batchers
            if len(batchers) >= MAX_BATCHERS:
                batchers.clear()
            batchers.add(route[1])
        return headers

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

    async def _pump(self, w: Watched) -> None:
        sock = w.sock
        on_message = self._on_message
        assert on_message is not None
        while not sock.closed:
            while w.backlog:
                route, frames = w.backlog.popleft()
                await on_message(route, frames)
            handled = 0
            while handled < self.batch:
                try:
                    route, frames = recv_one(w)
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:
                    if self._closed or sock.closed:
                        return
                    log.warning("recv_failed", error=str(exc), peer=w.peer)
                    break
                handled += 1
                self._received += 1
                if self.wire_bytes is not None:
                    self.wire_bytes[1] += frames_bytes(frames)
                if not w.is_router and self.refuse is not None and self.refuse(w.peer):
                    self._count_refused(w.peer, "receive")
                    continue
                if len(frames) == 1 and frames[0][:1] == BATCH_MARK:
                    headers = self._unbatch(w, route, frames[0])
                    if headers is not None:
                        for header in headers:
                            await on_message(route, [header])
                        continue
                await on_message(route, frames)
            if handled == self.batch:
                await asyncio.sleep(0)  # let other tasks run between batches
                continue
            w.wake.clear()
            events = socket_events(sock)
            if events & POLLIN:
                continue
            if w.senders and events & POLLOUT:
                # Our reads may have consumed the descriptor's signal that the socket takes
                # messages again: pass it on to the parked senders, or they would wait forever.
                w.writable.set()
            w.waiting = True
            try:
                await w.wake.wait()
            finally:
                w.waiting = False

    def _dealer(self, address: str) -> Watched:
        w = self._dealers.get(address)
        if w is not None:
            return w
        if self._closed:
            raise Unreachable("transport is closed")
        try:
            sock = self._ctx.socket(zmq.DEALER)
        except zmq.ZMQError as exc:  # out of sockets or descriptors
            raise Unreachable(f"cannot open a connection to {address}: {_no_room(exc)}") from exc
        self._tune(sock, address)
        keys = self.security
        if keys is not None:
            curve_client(sock, keys)
        w = Watched(sock, address, is_router=False)
        try:
            self._peer_loss.watch(w)  # before it connects: its handshake's event is not missed
            sock.connect(address)
        except zmq.ZMQError as exc:
            self._peer_loss.forget(address)
            sock.close(0)
            raise Unreachable(f"cannot connect to {address}: {_no_room(exc)}") from exc
        self._dealers[address] = w
        self._serve_socket(w)
        return w

    async def send(self, address: str, frames: list[Any], *, block: bool = True) -> None:
        """Send to the mailbox at ``address``.

        Raises:
            MailboxFull: block=False and the peer's queue is at its high-water mark.
            Unreachable: the address cannot be connected to.
        """
        await self._send_on(self._peer(address), frames, block, address)

    def try_send(self, address: str, frames: list[Any]) -> bool:
        """Send to the mailbox at ``address`` if its queue has room; False, having sent nothing,
        when it is at its high-water mark. Raises like ``send``."""
        # The connection is made already but for a message or so per peer: look it up here.
        w = self._dealers.get(address) if self.refuse is None else None
        return self._put(self._peer(address) if w is None else w, frames, address)

    def _peer(self, address: str) -> Watched:
        if self.refuse is not None and self.refuse(address):
            self._count_refused(address, "send")
            raise Partitioned(
                f"traffic to {address} is refused: this process is partitioned from it by fault "
                "injection; end it with `troupe ctl heal`"
            )
        return self._dealer(address)

    @property
    def refused_counts(self) -> dict[str, int]:
        """Messages refused per peer while partitioned (sends and replies dropped)."""
        return dict(self._refused)

    def _count_refused(self, peer: str, direction: str) -> None:
        n = self._refused.get(peer, 0)
        self._refused[peer] = n + 1
        if n == 0:  # once per peer: a partition must be visible, not flood the log
            log.warning("partition_refused", peer=peer, direction=direction)

    async def reply(self, route: Any, frames: list[Any]) -> None:
        """Answer through ``route``; never waits (see ``try_reply``)."""
        self.try_reply(route, frames)

    def try_reply(self, route: Any, frames: list[Any]) -> bool:
        """Answer through ``route`` (mailbox, identity) without ever waiting.

        Whoever sends a reply (the reader callback, a pump, an actor's task) also serves every
        other peer, so a peer that does not read, or is gone, must not stall it (DESIGN.md,
        invariant 7); waiting would not even end: with ROUTER_MANDATORY a send to one full or
        closing connection fails while EVENTS reports POLLOUT for the others. A reply that the
        asker's connection cannot take now is held and retried off the reader (``ReplyOutbox``):
        a burst that outran the I/O thread still arrives. One that still cannot leave after
        ``REPLY_LINGER_S``, or beyond the outbox's bounds, or to an asker that is gone, is
        dropped, counted per mailbox (``replies_dropped``) and logged at most once per asker
        per interval.

        Returns:
            False when the reply was dropped at once; True when it was sent or held.
        """
        if route is None:
            return True
        mailbox, identity = route[0], route[1]  # with CURVE, the sender's user id follows
        replies = mailbox.replies
        if mailbox.draining and len(frames) == 1 and identity in mailbox.batchers:
            # Made while the reader drains: it leaves with the asker's others when the drain ends.
            held = replies.get(identity)
            if held is None:
                replies[identity] = [frames[0]]
            else:
                held.append(frames[0])
                if len(held) >= MAX_BATCH_MESSAGES:  # the asker starts on these meanwhile
                    self._send_replies(mailbox, identity, replies.pop(identity))
            return True
        if replies and identity in replies:  # the ones made before it leave first
            self._send_replies(mailbox, identity, replies.pop(identity))
        return self._reply_frames(mailbox, identity, frames, 1)

    def _flush_replies(self, mailbox: Watched) -> None:
        """Send the replies made while the mailbox's reader drained, batched per asker."""
        replies, mailbox.replies = mailbox.replies, {}
        for identity, headers in replies.items():
            self._send_replies(mailbox, identity, headers)

    def _send_replies(self, mailbox: Watched, identity: bytes, headers: list[bytes]) -> None:
        for frame, count in batch_frames(headers):
            self._reply_frames(mailbox, identity, [frame], count)

    def _reply_frames(self, mailbox: Watched, identity: bytes, frames: list[Any], count: int) -> bool:
        """``try_reply`` of one message, or of one batch frame holding ``count`` replies."""
        outbox = self._outbox
        if outbox.pending and outbox.holds(mailbox, identity):
            return self._hold(mailbox, identity, frames)  # behind the ones already held
        try:
            self._write(mailbox, [identity, *frames])
        except zmq.Again:
            return self._hold(mailbox, identity, frames)
        except zmq.ZMQError as exc:
            self._reply_dropped(mailbox, identity, exc, count)
            return False
        if count > 1:
            self._sent += count - 1
            self._batches_sent += 1
        return True

    def _hold(self, mailbox: Watched, identity: bytes, frames: list[Any]) -> bool:
        if self._loop is None or self._closed:
            self._reply_dropped(mailbox, identity, zmq.Again(), 1)
            return False
        return self._outbox.hold(mailbox, identity, frames, self._loop)

    def _reply_dropped(self, mailbox: Watched, identity: bytes, exc: zmq.ZMQError, n: int) -> None:
        mailbox.replies_dropped += n
        self._replies_dropped += n
        key = (mailbox.peer, identity)
        if not self._drop_log.should_log(key):
            return
        # EAGAIN: the asker's queue stayed at its high-water mark (it does not read): worth a
        # warning. EHOSTUNREACH: the asker disconnected, having given up (an ask timed out).
        # Else: the mailbox closed under it at shutdown.
        not_reading = isinstance(exc, zmq.Again)
        (log.warning if not_reading else log.info)(
            "reply_dropped",
            mailbox=mailbox.peer,
            peer=identity.hex(),
            reason="asker_not_reading" if not_reading else exc.strerror,
            dropped=n,
            unlogged_drops=self._drop_log.take_quiet(key),
            total=mailbox.replies_dropped,
        )

    def waiting(self) -> int:
        """Messages read off the mailboxes but not yet handed on (their pumps' backlogs).

        Safe to call from another thread (the heartbeat's): it only reads lengths.
        """
        return sum(len(w.backlog) for w in list(self._mailboxes))

    def replies_dropped(self) -> dict[str, int]:
        """Replies dropped so far, per mailbox endpoint (see ``try_reply``)."""
        return {w.peer: w.replies_dropped for w in self._mailboxes}

    async def _send_on(self, w: Watched, frames: list[Any], block: bool, address: str) -> None:
        while not self._put(w, frames, address):
            if not block:
                raise MailboxFull(
                    f"the mailbox of {address or 'the asker'} is full (high-water mark "
                    f"{self.hwm}); send with block=True to wait"
                )
            w.writable.clear()
            if socket_events(w.sock) & POLLOUT:
                continue
            w.senders += 1
            try:
                await w.writable.wait()
            finally:
                w.senders -= 1

    def _put(self, w: Watched, frames: list[Any], address: str) -> bool:
        """``_write``: False when the socket is full; EHOSTUNREACH as it is, other errors as
        Unreachable. A header alone sent while a look at the socket is due this turn (after
        an earlier send) waits for that look, and leaves with the others sent meanwhile; the
        first goes at once, so that a lone ask pays no wait."""
        if len(frames) == 1 and (w.out or (w.recheck and w.sent_before_look)):
            header = frames[0]
            if type(header) is bytes and len(header) + 5 <= MAX_BATCH_BYTES:
                if w.out_bytes + len(header) + 5 > MAX_BATCH_BYTES and not self._flush_out(w):
                    return False  # a full batch the peer cannot take yet: this one waits
                out = w.out
                out.append(header)
                w.out_bytes += len(header) + 4
                if len(out) >= MAX_BATCH_MESSAGES:
                    self._flush_out(w)  # the peer starts on these while more are made
                return True
        if w.out and not self._flush_out(w):
            return False
        try:
            self._write(w, frames)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise
            raise Unreachable(f"send to {address} failed: {exc.strerror}") from exc
        w.sent_before_look = w.recheck
        return True

    def _write(self, w: Watched, frames: list[Any]) -> None:
        """Queue one message on the socket without waiting; zmq.Again when it is full."""
        sock = w.sock
        # Only the first frame can fail with EAGAIN: ZeroMQ queues multipart messages
        # atomically, so after it the rest is accepted.
        more = len(frames) - 1
        try:
            for frame in frames:
                flags = NOBLOCK | SNDMORE if more else NOBLOCK
                more -= 1
                if type(frame) is bytes and len(frame) < COPY_BELOW:
                    send_frame(sock, frame, flags)
                else:
                    send_frame(sock, frame, flags, copy=False)
        except zmq.ZMQError:
            # A refused send may have consumed the signal just the same (and the outbox's
            # retries are made outside any read): the parked reader must still hear of input.
            if (w.waiting or w.senders) and not w.recheck and not w.draining:
                self._look_later(w)
            raise
        self._sent += 1
        if self.wire_bytes is not None:
            self.wire_bytes[0] += frames_bytes(frames)
        # The send may have consumed the descriptor's signal: pass it on to whoever is parked
        # (the reader, if input waits; other senders, if the socket takes messages). Those not
        # parked re-check EVENTS themselves before they park. One look after a run of sends is
        # enough (the parked ones need waking, not waking at once), so it is scheduled once
        # per loop turn rather than made after every send.
        if (w.waiting or w.senders) and not w.recheck and not w.draining:
            self._look_later(w)

    def _flush_out(self, w: Watched) -> bool:
        """Send the headers held for a peer connection (``_put``) as one frame; False when the
        peer cannot take it now (it is sent again shortly, and by the next sender to find room)."""
        out = w.out
        frame = out[0] if len(out) == 1 else pack_batch(out)
        try:
            self._write(w, [frame])
        except zmq.Again:
            self._retry_out_later(w)
            return False
        except zmq.ZMQError as exc:  # the connection closed under them (forget, close)
            log.info("batch_dropped", peer=w.peer, messages=len(out), reason=exc.strerror)
        else:
            if len(out) > 1:
                self._sent += len(out) - 1
                self._batches_sent += 1
        w.out = []
        w.out_bytes = 0
        w.out_delay = 0.0
        return True

    def _retry_out_later(self, w: Watched) -> None:
        if w.out_retry is not None or self._loop is None or self._loop.is_closed():
            return
        w.out_delay = min(max(w.out_delay * 2, FIRST_RETRY_S), MAX_RETRY_S)
        w.out_retry = self._loop.call_later(w.out_delay, self._retry_out, w)

    def _retry_out(self, w: Watched) -> None:
        w.out_retry = None
        if w.sock.closed:
            w.out = []
            return
        if w.out and self._flush_out(w) and w.senders:
            w.writable.set()  # parked senders wait behind the batch: it left

    def _look_later(self, w: Watched) -> None:
        """Schedule one look at the socket's EVENTS (``_recheck``) for whoever is parked."""
        w.recheck = True
        if self._loop is not None:
            self._loop.call_soon(self._recheck, w)
        else:
            self._recheck(w)

    def _recheck(self, w: Watched) -> None:
        w.recheck = False
        w.sent_before_look = False
        if w.out:
            # The look below follows this send: none other is scheduled (a peer that cannot
            # take the batch would make that a look every turn; its retries back off instead).
            w.recheck = True
            self._flush_out(w)
            w.recheck = False
        try:
            events = socket_events(w.sock)
        except zmq.ZMQError:  # closed meanwhile (forget, close): its pump has been told
            return
        if w.senders and events & POLLOUT:
            w.writable.set()
        if w.waiting and events & POLLIN:
            self._read(w, self.batch)  # what the descriptor would have said: read here, or wake the pump

    def _connection_lost(self, w: Watched) -> None:
        """The connection to ``w``'s peer ended after its handshake: the replies it sent before
        it went are handled first (they wait on the socket, or in its backlog), then the
        runtime is told (``on_peer_lost``)."""
        if self._closed or self._dealers.get(w.peer) is not w or w.sock.closed:
            return  # forgotten meanwhile: nothing waits on this connection any more
        try:
            unread = bool(w.backlog) or bool(socket_events(w.sock) & POLLIN)
        except zmq.ZMQError:
            return
        if unread:
            if w.waiting:
                self._read(w, self.batch)
            else:
                w.wake.set()
            assert self._loop is not None
            self._loop.call_soon(self._connection_lost, w)
            return
        if self.on_peer_lost is not None:
            self.on_peer_lost(w.peer)

    def _connection_refused(self, w: Watched, why: str, given_up: bool) -> None:
        """The peer at ``w`` refused the handshake for keys, for the reason ``why``; where
        ZeroMQ gave the connection up, it is forgotten (the next send makes a new one)."""
        if self._closed or self._dealers.get(w.peer) is not w:
            return
        if self.on_peer_refused is not None:
            self.on_peer_refused(w.peer, why)
        if given_up:
            self.forget(w.peer)

    def forget(self, address: str) -> None:
        """Close the connection to a peer that is gone; the next send reconnects."""
        w = self._dealers.pop(address, None)
        if w is None:
            return
        self._peer_loss.forget(address)
        if w.out_retry is not None:
            w.out_retry.cancel()
        w.out = []
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.remove_reader(w.fd)
            except (ValueError, OSError):
                pass
        w.sock.close(0)
        w.wake.set()  # its pump sees the closed socket and ends
        w.writable.set()

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
