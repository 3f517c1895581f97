"""Reading a socket of the ZeroMQ transport: the reader callback and the socket's pump.

The event loop calls the reader callback (``_readable``) when a socket's descriptor fires. With
the pump parked, the callback reads here and hands each message to the runtime's
``sync_handler``, which handles it at once where that needs no waiting (a reply, a delivery to
a mailbox with room): no task wakes for it. The first message that must wait goes to the
socket's backlog, and the pump task (``_pump``) takes over from it, in order, reading on until
the socket is empty before it parks again. A batch frame (wire/batch_frames.py) is taken apart
into its messages on the way, and a mailbox remembers which askers send batches (its replies
to them leave batched: ``zmq_replies``).

:class:`ZmqReceiving` is a part of :class:`~troupe.runtime.transports.zmq.ZmqTransport`: it
uses the transport's fields.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from troupe.runtime.library_logging import get_logger
from troupe.runtime.wire.batch_frames import BATCH_MARK, unpack_batch

from .zmq_socket import POLLIN, POLLOUT, Watched, frames_bytes, recv_one, socket_events

if TYPE_CHECKING:
    from .base import OnMessage

__all__ = ["MAX_BATCHERS", "ZmqReceiving"]

log = get_logger(__name__)

# Askers a mailbox remembers as reading batches; past this it forgets them all (they batch
# again, and are remembered again, at their next batch).
MAX_BATCHERS = 65_536


class ZmqReceiving:
    """Reads the transport's sockets (a part of the transport)."""

    batch: int  # messages handled per wake-up before yielding to other tasks
    sync_handler: Callable[[Any, list[Any]], bool] | None
    refuse: Callable[[str], bool] | None
    wire_bytes: list[int] | None
    _on_message: OnMessage | None
    _loop: asyncio.AbstractEventLoop | None
    _closed: bool
    _received: int
    _batches_received: int
    _flush_replies: Callable[[Watched], None]  # zmq_replies
    _recheck: Callable[[Watched], None]  # zmq_sending
    _count_refused: Callable[[str, str], None]  # the transport's

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
