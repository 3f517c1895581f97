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

A CURVE client whose server key is not the peer's (``cluster.key`` of another cluster, or one
rotated since) is refused in silence too: the peer cannot open the client's hello, hangs up, and
the client sees only the connection end before the handshake did (``NO_DETAIL``, the peer's
hang-up: EPIPE or ECONNRESET), again at each of ZeroMQ's retries. Once is no mismatch (a peer
that stopped mid-handshake, then restarts); two in a row, with no handshake completed between,
are told (``on_refused``, naming the key's file), and each one after. A handshake that
timed out (EAGAIN: a paused peer accepts and says nothing) is no hang-up, and is not counted. A
peer without CURVE keys hangs up the same way where it sees the mismatch of mechanisms first;
where this side sees it first, it is told apart (a protocol failure, after which libzmq gives the
connection up: the transport forgets it, so that its next send tries again).

The other way round, a process without keys whose peer uses CURVE (a keyless ``troupe run
--master`` against a keyed cluster's master) is told the same two ways: the keyed peer hangs up
on its handshake (two in a row, as above), or this side sees the mismatch first. Its asks had
waited out their deadlines in silence, and the master was then said not to answer. A listener
that is no ZeroMQ peer and closes every connection at once looks like a hang-up from here; the
CLI's raw look at the greeting (``troupe.cli.zmtp_greeting``) tells it apart.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from pathlib import Path

import zmq
from zmq.utils.monitor import recv_monitor_message

from .zmq_socket import Watched

__all__ = ["HUNG_UP_IN_A_ROW", "PeerLossWatch"]

_UP = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
_DOWN = int(zmq.EVENT_DISCONNECTED)
_REFUSED = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_UNFINISHED = int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_PROTOCOL = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_NO_CURVE = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
_HUNG_UP = frozenset({errno.EPIPE, errno.ECONNRESET})  # not EAGAIN: the handshake's own timeout

HUNG_UP_IN_A_ROW = 2
"""Handshakes the peer hung up on, in a row, that say its server key is not the one this
process holds: one alone is a peer that stopped mid-handshake."""


def _key_refused(peer: str) -> str:
    return (
        f"the process at {peer} refused this process's CURVE key (not authorised there: is its "
        "public key in that host's keys directory, named operator-NAME.key or reader-NAME.key, "
        "and was that host restarted since?)"
    )


def _server_key_not_its(peer: str, server_key: Path) -> str:
    return (
        f"the CURVE handshake with {peer} failed: it hung up on every try, as a troupe process "
        f"does whose server key is not the one in {server_key} (rotated? another cluster's? copy "
        "that cluster's cluster.key there; its log says peer_refused), or one without CURVE "
        "keys, or a listener that is no ZeroMQ peer"
    )


def _keyless_hung_up_on(peer: str) -> str:
    return (
        f"the process at {peer} hung up on every handshake, as a troupe process with CURVE keys "
        "does to one without any (give this process the cluster's keys directory: --keys DIR, "
        "or $TROUPE_KEYS), or a listener that is no ZeroMQ peer"
    )


def _curve_there(peer: str) -> str:
    return (
        f"the process at {peer} uses CURVE keys (its handshake asks for them), and this process "
        "has none: give it the cluster's keys directory (--keys DIR, or $TROUPE_KEYS)"
    )


def _no_curve_there(peer: str, server_key: Path) -> str:
    return (
        f"the process at {peer} runs without CURVE keys (its handshake offers none), and this "
        f"process uses CURVE with the keys beside {server_key}: drop them, or start it with the "
        "cluster's keys"
    )


class PeerLossWatch:
    """The socket monitors of one transport's peer connections.

    Args:
        on_lost: told each connection that ended after its handshake had completed.
        on_refused: told each connection whose handshake the peer refused, why in words, and
            whether ZeroMQ gave the connection up: for this process's key (each try: ZeroMQ
            tries again); by hanging up on it :data:`HUNG_UP_IN_A_ROW` times in a row (and
            each time after); for a mechanism not this process's (given up): with
            ``server_key``, the peer has no CURVE; without, it has.
        server_key: the file of the server key the connections present CURVE with (a keys
            directory's ``cluster.key``); None without CURVE.
    """

    def __init__(
        self,
        on_lost: Callable[[Watched], None],
        on_refused: Callable[[Watched, str, bool], None] | None = None,
        server_key: Path | None = None,
    ) -> None:
        self._on_lost = on_lost
        self._on_refused = on_refused
        self._server_key = server_key
        self._events = _UP | _DOWN | _REFUSED | _UNFINISHED | _PROTOCOL
        self._monitors: dict[str, tuple[zmq.Socket[bytes], Watched]] = {}
        self._up: set[str] = set()
        # Per peer: the handshakes it hung up on since the last one that completed.
        self._hung_up: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, w: Watched) -> None:
        """Monitor the peer connection ``w`` (before it connects: no event is missed)."""
        monitor: zmq.Socket[bytes] = w.sock.get_monitor_socket(self._events)
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
            self.heard(w, event.get("event"), event.get("value"))

    def heard(self, w: Watched, kind: object, value: object) -> None:
        """One event of ``w``'s monitor: its kind (``zmq.EVENT_*``) and value (an errno, a
        ZAP status code)."""
        peer = w.peer
        if kind == _UP:
            self._up.add(peer)
            self._hung_up.pop(peer, None)
        elif kind == _DOWN and peer in self._up:
            self._up.discard(peer)
            self._on_lost(w)
        elif kind == _REFUSED:
            self._hung_up.pop(peer, None)
            if self._on_refused is not None:
                self._on_refused(w, _key_refused(peer), False)
        elif kind == _PROTOCOL and value == _NO_CURVE:
            # libzmq ends the connection for good: the transport forgets it, and its next send
            # tries (and is told) again.
            self._hung_up.pop(peer, None)
            if self._on_refused is not None:
                key = self._server_key
                self._on_refused(w, _curve_there(peer) if key is None else _no_curve_there(peer, key), True)
        elif kind == _UNFINISHED:
            if value not in _HUNG_UP:  # timed out: a paused peer, not a refusal
                self._hung_up.pop(peer, None)
                return
            n = self._hung_up[peer] = self._hung_up.get(peer, 0) + 1
            if n >= HUNG_UP_IN_A_ROW and self._on_refused is not None:
                key = self._server_key
                why = _keyless_hung_up_on(peer) if key is None else _server_key_not_its(peer, key)
                self._on_refused(w, why, False)

    def forget(self, peer: str) -> None:
        """Stop monitoring the connection to ``peer`` (before its socket closes)."""
        entry = self._monitors.pop(peer, None)
        self._up.discard(peer)
        self._hung_up.pop(peer, None)
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
        self._hung_up.clear()

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
