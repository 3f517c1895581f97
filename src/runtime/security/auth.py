"""The ZAP authenticator: only peers with an authorised CURVE key are let in.

ZeroMQ asks the ZAP handler of a socket's context about every CURVE handshake on a server
socket; without one bound, libzmq lets every client in. So a process with keys makes its ZeroMQ
sockets in one context (``Gate.context``), with a pyzmq ``ThreadAuthenticator`` started on it
before any socket binds. The authenticator runs in a thread of its own, independent of the
process's event loops; its credentials provider (``Gatekeeper``) admits the keys of the
authorised set, and counts and logs (rate-limited per key) every other one. An admitted peer's
messages carry its user id (``operator:alice``) as the ZeroMQ ``User-Id`` property, which the
runtime reads to decide what that peer may do (``roles``).

A peer that does not even speak CURVE fails the handshake before ZAP is asked: it is never
let in either, and is counted by the transport's socket monitor, not here.
"""

from __future__ import annotations

import os
import resource
import threading
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from troupe.runtime.core.peer_limits import PeerLogGate
from troupe.runtime.library_logging import get_logger

from .keys import CurveKeys

__all__ = [
    "REFUSED_LOG_INTERVAL_S",
    "Gate",
    "Gatekeeper",
    "curve_client",
    "curve_server",
    "gate_for",
    "incomplete_handshakes",
    "private_context",
    "raise_socket_limit",
    "refused_peers",
]

log = get_logger(__name__)

# One log line per refused key per this many seconds, however often it knocks.
REFUSED_LOG_INTERVAL_S = 10.0


class Gatekeeper:
    """The authenticator's credentials provider: which keys are in, and who was turned away.

    Args:
        authorised: every authorised public key (Z85) and its holder's user id.
    """

    def __init__(self, authorised: dict[bytes, str]) -> None:
        self.authorised = authorised
        self.refused = 0  # handshakes refused, all keys together
        self.refused_keys: dict[str, int] = {}  # per refused key (Z85), for status
        self.peer_address = ""  # of the handshake being judged (set by the authenticator)
        self._log = PeerLogGate(REFUSED_LOG_INTERVAL_S)
        self._lock = threading.Lock()  # counted in the auth thread, read from the event loop

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider hook: True to let the peer with ``key`` (Z85) in."""
        if key in self.authorised:
            return True
        shown = key.decode("ascii", "replace")
        with self._lock:
            self.refused += 1
            self.refused_keys[shown] = self.refused_keys.get(shown, 0) + 1
            if len(self.refused_keys) > 1000:  # a flood of fresh keys must not grow this forever
                self.refused_keys.pop(next(iter(self.refused_keys)))
        if self._log.should_log(shown):
            log.warning(
                "peer_refused",
                reason="key not authorised",
                peer_key=shown,
                peer_address=self.peer_address,
                refused=self.refused,
                unlogged=self._log.take_quiet(shown),
            )
        return False

    def user_id(self, z85_key: bytes) -> str:
        """The user id of an admitted key."""
        return self.authorised.get(z85_key, "unknown")


def raise_socket_limit(context: zmq.Context[Any]) -> None:
    """Let ``context`` (before its first socket) open as many sockets as the process may open
    files. ZeroMQ's default, 1,023, was a thousand peers' connections; each now takes three
    sockets (the connection, and its monitor's two: transports/zmq_peer_loss.py), and a master
    tells a thousand workers' processes about their leases. Past the file limit, each socket's
    own descriptor would fail first anyway."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = int(context.get(zmq.SOCKET_LIMIT))
    wanted = most if soft == resource.RLIM_INFINITY else min(most, max(soft, 1023))
    try:
        context.set(zmq.MAX_SOCKETS, wanted)
    except zmq.ZMQError as exc:
        log.debug("socket_limit_unset", reason=exc.strerror)


def private_context(batch_io_thread: bool) -> zmq.Context[Any]:
    """A zmq Context whose I/O thread, with ``batch_io_thread``, runs under SCHED_BATCH.

    Every send that finds the I/O thread asleep wakes it. Under the default policy the woken
    thread preempts the event loop on its own core at once, two context switches in the middle
    of the loop's work (costly on virtual machines); under SCHED_BATCH it never preempts on
    wake-up: it runs on an idle core at once, or when the loop next waits. On this project's
    2-core machines that lifts ask throughput with 64 outstanding by about a third (85k to
    100-119k round trips/s); a plain blocking pyzmq program gains nothing from it, since it
    waits right after each send anyway.
    SCHED_BATCH needs no privileges; where it is missing (not Linux) the default stays. Its
    sockets may be as many as the process's files (``raise_socket_limit``). The transports' and
    the CURVE gate's contexts are made here: the gate's is its authenticator's too.
    """
    ctx: zmq.Context[Any] = zmq.Context()
    raise_socket_limit(ctx)
    policy = getattr(os, "SCHED_BATCH", None)
    if batch_io_thread and policy is not None:
        try:
            ctx.set(zmq.THREAD_SCHED_POLICY, policy)  # before the first socket starts the thread
        except zmq.ZMQError as exc:
            log.debug("io_thread_policy_unset", reason=exc.strerror)
    return ctx


class _Authenticator(ThreadAuthenticator):
    """pyzmq's thread authenticator, telling the gatekeeper whose handshake it judges and
    naming admitted peers by role rather than by key."""

    def __init__(self, context: zmq.Context[Any], gatekeeper: Gatekeeper) -> None:
        super().__init__(context)
        self.gatekeeper = gatekeeper

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        # A ZAP request: version, request id, domain, address, identity, mechanism, credentials.
        self.gatekeeper.peer_address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        await super().handle_zap_message(msg)

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.gatekeeper.user_id(zmq.utils.z85.encode(client_public_key))


class Gate:
    """The ZeroMQ context of a process with keys, and the authenticator guarding it.

    Args:
        keys: the process's keys.
        batch_io_thread: run the context's I/O thread under SCHED_BATCH (see the transport).
    """

    def __init__(self, keys: CurveKeys, batch_io_thread: bool = True) -> None:
        self.keys = keys
        self.context = private_context(batch_io_thread)
        self.gatekeeper = Gatekeeper(dict(keys.authorised))
        self.authenticator = _Authenticator(self.context, self.gatekeeper)
        self.authenticator.start()  # before any socket binds: without it, libzmq admits anyone
        self.authenticator.configure_curve_callback("*", credentials_provider=self.gatekeeper)
        self.handshakes_failed = 0  # peers that failed the handshake itself (the transport counts)
        self.handshakes_incomplete = 0  # connections that hung up before the handshake ended

    @property
    def refused(self) -> int:
        """Peers turned away: unauthorised keys plus failed handshakes."""
        return self.gatekeeper.refused + self.handshakes_failed


_GATES: dict[int, Gate] = {}
_GATES_LOCK = threading.Lock()


def gate_for(keys: CurveKeys) -> Gate:
    """The one gate (context and authenticator) of ``keys`` in this process, made on first use."""
    with _GATES_LOCK:
        gate = _GATES.get(id(keys))
        if gate is None or gate.keys is not keys:
            gate = _GATES[id(keys)] = Gate(keys)
        return gate


def refused_peers() -> int:
    """Peers refused so far by every gate of this process (for status)."""
    with _GATES_LOCK:
        return sum(g.refused for g in _GATES.values())


def incomplete_handshakes() -> int:
    """Connections to this process that hung up before the CURVE handshake ended (port probes,
    or peers without CURVE that noticed the mismatch first)."""
    with _GATES_LOCK:
        return sum(g.handshakes_incomplete for g in _GATES.values())


def curve_server(sock: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Make ``sock`` (before it binds) a CURVE server with ``keys``. It must have been made in
    ``gate_for(keys).context``, where the authenticator judges who connects."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True


def curve_client(sock: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Make ``sock`` (before it connects) present ``keys`` and expect the cluster's server key."""
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret
