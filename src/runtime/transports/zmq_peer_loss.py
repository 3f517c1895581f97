"""Connections to peers that end while asks wait on them.

An ask waits for its reply on the connection it was sent on. When the asked process dies (a
crash, its supervisor's SIGKILL, a node stopping it), nothing else would end that wait before
the ask's deadline (30 s by default; an hour, for a long job). Each connection the transport
makes to a peer therefore has a ZeroMQ socket monitor for two events, read on the event loop
(the monitor's descriptor is edge-triggered, like a socket's: read until empty, and read once
as it is watched, which arms it): the handshake that completed, and the disconnection. A
connection whose handshake had completed and which then ended means the peer's process closed
it; the transport reads the replies the peer sent before it went (they came first, on the
connection's own socket), then says so, and the runtime ends the asks still waiting there with
``PeerLost``.

A connection that never completed a handshake (nobody listening yet) is no loss: its asks wait
as before while ZeroMQ reconnects. One whose handshake the peer refused for this process's CURVE
key (its authenticator said 400: the key is not in its keys directory) is told apart
(``on_refused``): the asks waiting there cannot be answered until someone copies a key, and
waited out their deadlines in silence (two minutes, for a replica a node would not start).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from .zmq_socket import Watched

__all__ = ["PeerLossWatch"]

_UP = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
_DOWN = int(zmq.EVENT_DISCONNECTED)
_REFUSED = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class PeerLossWatch:
    """The socket monitors of one transport's peer connections.

    Args:
        on_lost: told each connection that ended after its handshake had completed.
        on_refused: told each connection whose handshake the peer refused for this process's
            key (each try: ZeroMQ tries again).
    """

    def __init__(
        self, on_lost: Callable[[Watched], None], on_refused: Callable[[Watched], None] | None = None
    ) -> None:
        self._on_lost = on_lost
        self._on_refused = on_refused
        self._monitors: dict[str, tuple[zmq.Socket[bytes], Watched]] = {}
        self._up: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, w: Watched) -> None:
        """Monitor the peer connection ``w`` (before it connects: no event is missed)."""
        monitor: zmq.Socket[bytes] = w.sock.get_monitor_socket(_UP | _DOWN | _REFUSED)
        self._monitors[w.peer] = (monitor, w)
        if self._loop is not None:
            self._loop.add_reader(monitor.fileno(), self._read, w.peer)
            # A read that finds nothing arms the descriptor: the monitor's first event would
            # otherwise arrive without a signal.
            self._read(w.peer)

    def serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start reading every monitor on ``loop`` (the transport serves)."""
        self._loop = loop
        for peer, (monitor, _) in list(self._monitors.items()):
            loop.add_reader(monitor.fileno(), self._read, peer)
            self._read(peer)  # what came before the reader was added

    def _read(self, peer: str) -> None:
        entry = self._monitors.get(peer)
        if entry is None:
            return
        monitor, w = entry
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.ZMQError:  # Again: read it all; or closed meanwhile
                return
            kind = event.get("event")
            if kind == _UP:
                self._up.add(peer)
            elif kind == _DOWN and peer in self._up:
                self._up.discard(peer)
                self._on_lost(w)
            elif kind == _REFUSED and self._on_refused is not None:
                self._on_refused(w)

    def forget(self, peer: str) -> None:
        """Stop monitoring the connection to ``peer`` (before its socket closes)."""
        entry = self._monitors.pop(peer, None)
        self._up.discard(peer)
        if entry is not None:
            self._close(*entry)

    def unwatch(self) -> None:
        """Stop reading the monitors (the loop is going away)."""
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        for monitor, _ in self._monitors.values():
            try:
                loop.remove_reader(monitor.fileno())
            except (ValueError, OSError, zmq.ZMQError):
                pass

    def close(self) -> None:
        """Close every monitor (before the connections' sockets close)."""
        for monitor, w in self._monitors.values():
            self._close(monitor, w)
        self._monitors.clear()
        self._up.clear()

    def _close(self, monitor: zmq.Socket[bytes], w: Watched) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.remove_reader(monitor.fileno())
            except (ValueError, OSError, zmq.ZMQError):
                pass
        if not w.sock.closed:
            try:
                w.sock.disable_monitor()
            except zmq.ZMQError:
                pass
        monitor.close(0)
