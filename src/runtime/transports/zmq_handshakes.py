"""Failed CURVE handshakes on a transport's mailboxes: counted and logged, never delivered.

A peer without CURVE (a plain socket, a port scanner, garbage bytes) fails the handshake of a
CURVE mailbox before the authenticator is asked, so the authenticator never sees it. Each
mailbox therefore has a ZeroMQ socket monitor for failed handshakes; its events are read on
the event loop (the monitor's descriptor, like a socket's, is edge-triggered: read until
empty), counted on the process's gate and logged at most once per mailbox per interval. A key
the authenticator refused is counted there, not here (its handshake fails for "auth").
"""

from __future__ import annotations

import asyncio
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from troupe.runtime.core.peer_limits import PeerLogGate
from troupe.runtime.library_logging import get_logger
from troupe.runtime.security.auth import REFUSED_LOG_INTERVAL_S, Gate

__all__ = ["HandshakeWatch"]

log = get_logger(__name__)

# A protocol failure is a peer that spoke something else (no CURVE, garbage): refused. A
# connection that ended before the handshake did (NO_DETAIL) is either such a peer that hung
# up first (which side notices the mismatch first is a race) or a port probe (the CLI's "is
# anyone there"): counted apart, as incomplete, and logged at info. A refused key is counted
# by the authenticator.
_PROTOCOL = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_FAILED = _PROTOCOL | int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def _name(code: Any) -> str:
    """A ZMQ_PROTOCOL_ERROR_* code as its name (``ZMTP_MECHANISM_MISMATCH``)."""
    name = getattr(code, "name", None)
    return str(name).removeprefix("PROTOCOL_ERROR_") if name else str(code)


class HandshakeWatch:
    """The socket monitors of one transport's CURVE mailboxes.

    Args:
        gate: the process's gate for its keys, where failures are counted; None without keys
            (then nothing is watched).
    """

    def __init__(self, gate: Gate | None) -> None:
        self.gate = gate
        self._monitors: list[tuple[zmq.Socket[bytes], str]] = []
        self._watched: list[zmq.Socket[bytes]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log = PeerLogGate(REFUSED_LOG_INTERVAL_S)

    def watch(self, sock: zmq.Socket[bytes], endpoint: str) -> None:
        """Monitor the failed handshakes of mailbox ``sock`` bound at ``endpoint``."""
        if self.gate is None:
            return
        monitor = sock.get_monitor_socket(_FAILED)
        self._watched.append(sock)
        self._monitors.append((monitor, endpoint))
        if self._loop is not None:
            self._loop.add_reader(monitor.fileno(), self._read, monitor, endpoint)

    def serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start reading every monitor on ``loop`` (the transport serves)."""
        self._loop = loop
        for monitor, endpoint in self._monitors:
            loop.add_reader(monitor.fileno(), self._read, monitor, endpoint)
            self._read(monitor, endpoint)  # what came before the reader was added

    def _read(self, monitor: zmq.Socket[bytes], endpoint: str) -> None:
        assert self.gate is not None
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.ZMQError:  # Again: read it all; or closed meanwhile
                return
            if event.get("event") == _PROTOCOL:
                self.gate.handshakes_failed += 1
                if self._log.should_log(endpoint):
                    log.warning(
                        "peer_refused",
                        reason="handshake failed (no CURVE, or not this cluster's server key)",
                        mailbox=endpoint,
                        error=_name(event.get("value")),
                        refused=self.gate.refused,
                        unlogged=self._log.take_quiet(endpoint),
                    )
            else:
                self.gate.handshakes_incomplete += 1
                # Debug only: every `troupe ctl` probes its endpoint first (a connect, then a
                # hang-up), and the logs held mostly these. Counted either way (`ctl status`).
                if self._log.should_log((endpoint, "incomplete")):
                    log.debug(
                        "handshake_incomplete",
                        reason="the peer hung up before the CURVE handshake ended (a port probe, "
                        "or a peer without CURVE)",
                        mailbox=endpoint,
                        incomplete=self.gate.handshakes_incomplete,
                        unlogged=self._log.take_quiet((endpoint, "incomplete")),
                    )

    def unwatch(self) -> None:
        """Stop reading the monitors (the loop is going away)."""
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        for monitor, _ in self._monitors:
            try:
                loop.remove_reader(monitor.fileno())
            except (ValueError, OSError, zmq.ZMQError):
                pass

    def close(self) -> None:
        """Close the monitors (before their mailboxes close)."""
        self.unwatch()
        for sock in self._watched:
            if not sock.closed:
                try:
                    sock.disable_monitor()
                except zmq.ZMQError:
                    pass
        for monitor, _ in self._monitors:
            monitor.close(0)
        self._monitors.clear()
        self._watched.clear()
