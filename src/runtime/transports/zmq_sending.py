"""Sending to a peer on the ZeroMQ transport: without waiting where the socket takes the message,
and the small messages of one loop turn as one batch frame.

``send`` waits while the peer's connection is at its high-water mark (backpressure); ``try_send``
says so instead. A header sent alone while a look at the socket is due this turn (after an
earlier send) is held in the connection's ``out`` and leaves with the others sent meanwhile, as
one batch frame (wire/batch_frames.py), when that look runs (``_recheck``); a batch the peer
cannot take yet is retried with a backoff. The ZeroMQ descriptor is edge-triggered and a send
may consume its signal, so a send made outside a read schedules one look at ``EVENTS`` per loop
turn (``_look_later``), which wakes whoever is parked: the reader, or other senders.

:class:`ZmqSending` is a part of :class:`~troupe.runtime.transports.zmq.ZmqTransport`: it uses
the transport's fields.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import zmq

from troupe.runtime.errors import MailboxFull, Unreachable
from troupe.runtime.library_logging import get_logger
from troupe.runtime.wire.batch_frames import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES, pack_batch

from .zmq_outbox import FIRST_RETRY_S, MAX_RETRY_S
from .zmq_socket import (
    COPY_BELOW,
    NOBLOCK,
    POLLIN,
    POLLOUT,
    SNDMORE,
    Watched,
    frames_bytes,
    send_frame,
    socket_events,
)

__all__ = ["ZmqSending"]

log = get_logger(__name__)


class ZmqSending:
    """Sends on the transport's sockets (a part of the transport)."""

    hwm: int  # high-water mark of every socket
    batch: int  # messages handled per wake-up before yielding to other tasks
    refuse: Callable[[str], bool] | None
    wire_bytes: list[int] | None
    _dealers: dict[str, Watched]
    _loop: asyncio.AbstractEventLoop | None
    _sent: int
    _batches_sent: int
    _peer: Callable[[str], Watched]  # zmq_connections
    _read: Callable[[Watched, int], None]  # zmq_receiving

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
