"""Whether what listens at a TCP endpoint speaks ZeroMQ, from the first bytes it sends.

A troupe node or master that does not answer a command within its timeout was said to be busy,
paused or hung, and the user sent to its log; but the endpoint may be no troupe process at all
(the node's own ``--metrics`` port, any HTTP server: an easy slip), and pyzmq says nothing of a
peer that never completes its handshake. A ZeroMQ peer sends its greeting's signature (0xFF,
eight bytes, 0x7F) as soon as it accepts a connection, before it reads anything, from libzmq's
I/O thread, which a busy troupe process's Python does not hold: a raw connection that reads
other bytes, or none within a bound, found no troupe process, or (none) one that is paused
(SIGSTOP), whose kernel still accepts connections.
"""

from __future__ import annotations

import enum
import socket
import time
from urllib.parse import urlsplit

__all__ = ["GREETING_S", "Greeting", "greeting", "mechanism"]

GREETING_S = 1.0
"""How long a peer may take to greet after the connect, over a fast link (a LAN's greeting comes
within a millisecond); a slow link's connect time is added (:func:`greeting`)."""

_SIGNATURE_FIRST = 0xFF  # ZMTP's greeting starts with it (ZMTP 1.0's short frames never do)
_SIGNATURE_LEN = 10


class Greeting(enum.Enum):
    """What a raw connection to an endpoint read."""

    ZMTP = "zmtp"  # a ZeroMQ peer: a troupe process, busy or hung
    OTHER = "other"  # bytes that are not ZeroMQ's: no troupe process
    NONE = "none"  # nothing within the bound, or the connection closed: no troupe process, or a paused one
    UNKNOWN = "unknown"  # not a TCP endpoint, or the connect failed: nothing to tell


def greeting(endpoint: str, connect_s: float = 0.0, timeout: float = GREETING_S) -> Greeting:
    """Connect to ``endpoint`` and read the first bytes its peer sends within ``timeout`` plus
    twice ``connect_s`` (the link's round trip as the CLI's own connect took it)."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or parts.port is None:
        return Greeting.UNKNOWN
    bound = timeout + 2 * connect_s
    first = b""
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port), bound) as sock:
            deadline = time.monotonic() + bound
            while len(first) < _SIGNATURE_LEN and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                chunk = sock.recv(_SIGNATURE_LEN - len(first))
                if not chunk:  # closed by the peer
                    break
                first += chunk
    except TimeoutError:
        pass  # what came so far decides
    except OSError:
        return Greeting.UNKNOWN if not first else _judge(first)
    return _judge(first)


def _judge(first: bytes) -> Greeting:
    if not first:
        return Greeting.NONE
    return Greeting.ZMTP if first[0] == _SIGNATURE_FIRST else Greeting.OTHER


_GREETING_LEN = 64  # ZMTP 3: signature, version, mechanism (20 bytes, NUL-padded), as-server, filler
_OURS = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03"  # signature and major version 3: enough for libzmq
# to send the rest of its greeting; no mechanism of ours follows, so no peer's ZAP ever runs


def mechanism(endpoint: str, connect_s: float = 0.0, timeout: float = GREETING_S) -> str | None:
    """The security mechanism the ZeroMQ peer at ``endpoint`` offers in its greeting (``NULL``:
    no CURVE keys; ``CURVE``), or None where it cannot be told (report kl 5: a keyed client was
    told of a rotated key by a peer that runs without keys, as libzmq says only that it hung up)."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or parts.port is None:
        return None
    bound = timeout + 2 * connect_s
    got = b""
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port), bound) as sock:
            sock.sendall(_OURS)
            deadline = time.monotonic() + bound
            while len(got) < _GREETING_LEN and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                chunk = sock.recv(_GREETING_LEN - len(got))
                if not chunk:
                    break
                got += chunk
    except OSError:
        pass  # what came so far decides
    if len(got) < _GREETING_LEN or got[0] != _SIGNATURE_FIRST or got[10] < 3:
        return None
    return got[12:32].rstrip(b"\0").decode("ascii", "replace")
