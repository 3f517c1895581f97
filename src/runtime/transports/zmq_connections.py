"""The ZeroMQ transport's connections to its peers: one DEALER per peer address, made at the
first send there, and their end.

A connection is made where a send needs it (``_dealer``), refused at once to a peer that fault
injection partitions this process from (``_peer``), watched for its handshake and its end
(``zmq_peer_loss``), and closed when the peer is gone (``forget``: the next send connects anew).
A connection that ends after its handshake tells the runtime (``on_peer_lost``) once the replies
the peer sent before it went are handled; one whose peer refused its keys tells
``on_peer_refused``.

:class:`ZmqConnections` is a part of :class:`~troupe.runtime.transports.zmq.ZmqTransport`: it
uses the transport's fields.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from troupe.runtime.errors import Partitioned, Unreachable
from troupe.runtime.security.auth import curve_client

from .zmq_socket import POLLIN, Watched, socket_events, tune

if TYPE_CHECKING:
    from troupe.runtime.security.keys import CurveKeys

    from .zmq_peer_loss import PeerLossWatch

__all__ = ["ZmqConnections"]


def _no_room(exc: zmq.ZMQError) -> str:
    """Why a connection could not be opened, with what to do when descriptors ran out."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return f"{exc.strerror} (this process is out of file descriptors: raise its limit, ulimit -n)"
    return str(exc.strerror)


class ZmqConnections:
    """Connects to the transport's peers and forgets them (a part of the transport)."""

    security: CurveKeys | None
    hwm: int  # high-water mark of every socket
    max_message_bytes: int  # the largest frame any socket takes; -1: no limit
    batch: int  # messages handled per wake-up before yielding to other tasks
    refuse: Callable[[str], bool] | None
    on_peer_lost: Callable[[str], None] | None
    on_peer_refused: Callable[[str, str], None] | None
    _ctx: zmq.Context[Any]
    _dealers: dict[str, Watched]
    _peer_loss: PeerLossWatch
    _loop: asyncio.AbstractEventLoop | None
    _closed: bool
    _serve_socket: Callable[[Watched], None]  # the transport's
    _count_refused: Callable[[str, str], None]  # the transport's
    _read: Callable[[Watched, int], None]  # zmq_receiving

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
        tune(sock, address, self.hwm, self.max_message_bytes)
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

    def _peer(self, address: str) -> Watched:
        if self.refuse is not None and self.refuse(address):
            self._count_refused(address, "send")
            raise Partitioned(
                f"traffic to {address} is refused: this process is partitioned from it by fault "
                "injection; end it with `troupe ctl heal`"
            )
        return self._dealer(address)

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
