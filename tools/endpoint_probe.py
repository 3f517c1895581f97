"""The CLI's look at an endpoint before it talks to what should listen there: whether anything
accepts connections (ZeroMQ never reports a refused connection, it retries quietly), why not in
one clause, how long the connect took (a slow link's round trip), and what to do about it.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from troupe.runtime.transports.ipc_socket import ipc_path
from troupe.runtime.transports.ipc_socket import unreachable_why as ipc_unreachable_why

__all__ = ["PROBE_S", "Probe", "nobody_listens", "probe", "reachable", "unreachable_why", "what_to_do"]


PROBE_S = 3.0
"""How long a probe's connect may take before the CLI says nothing accepted it: past the
kernel's first SYN retransmit (1 s) and a slow link's round trip, so that one packet lost on a
lossy or distant link is not "no master" (at 0.5 s, a link of 0.6 s round trip failed most
commands so). A refused connection is answered at once, whatever the bound."""

_REFUSED = " (connection refused)"


def reachable(endpoint: str, timeout: float = PROBE_S) -> bool:
    """Return whether something accepts connections at ``endpoint`` (inproc: assume so).

    ZeroMQ never reports a refused connection, it retries quietly; this probe lets the CLI say
    "no master" at once instead of after a timeout.
    """
    return unreachable_why(endpoint, "process", timeout) is None


def unreachable_why(endpoint: str, what: str, timeout: float = PROBE_S) -> str | None:
    """Why nothing accepts connections at ``endpoint``, one clause naming it (``what``: who
    would listen there); None when something does (inproc: assume so). :func:`probe`'s
    ``absent``."""
    return probe(endpoint, what, timeout).absent


@dataclass(frozen=True, slots=True)
class Probe:
    """What the look at an endpoint found.

    Attributes:
        absent: why nothing accepts connections there (:func:`unreachable_why`), None where
            something does.
        connect_s: how long the connect took: about one round trip of the link (0 where none
            was made, ipc and inproc aside), which :func:`silence` reads.
    """

    absent: str | None
    connect_s: float = 0.0


_clock = time.monotonic  # a test's fake link moves its own


def probe(endpoint: str, what: str, timeout: float = PROBE_S) -> Probe:
    """Look whether anything accepts connections at ``endpoint``, and how fast it does.

    tcp: ``no WHAT answers at ENDPOINT (connection refused)``, or the network's own reason (no
    route to the host; no answer to the connect within ``timeout``: a host down, or packets
    dropped on the way). ipc: a real connect to its socket file says whether there is none, a
    stale one, or one this user may not reach. :func:`what_to_do` adds the advice for each.
    """
    path = ipc_path(endpoint)
    if path is not None:
        return Probe(ipc_unreachable_why(path, what, timeout))
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or parts.port is None:
        return Probe(None)
    start = _clock()
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port), timeout):
            return Probe(None, _clock() - start)
    except ConnectionRefusedError:
        return Probe(f"no {what} answers at {endpoint}{_REFUSED}")
    except TimeoutError:
        return Probe(
            f"nothing at {endpoint} accepted a connection within {timeout:g} s (its host is down "
            "or unreachable, or the network drops packets on the way)"
        )
    except OSError as exc:  # no route to the host, the network down
        reason = (exc.strerror or str(exc)).lower()
        return Probe(f"no {what} answers at {endpoint} ({reason})")


def nobody_listens(absent: str) -> bool:
    """Whether ``absent`` (:func:`unreachable_why`'s clause) says that nothing listens there (a
    refused connect, no ipc socket), rather than that the network did not carry the connect."""
    return absent.endswith(_REFUSED) or " listens at " in absent


def what_to_do(absent: str, start: str) -> str:
    """``absent`` (:func:`unreachable_why`'s clause) and what to do: ``start`` (start one) where
    nothing listens there; where the network did not carry the connect, a look at it (starting
    another there would put a second one beside the one the network hides)."""
    if nobody_listens(absent):
        return f"{absent}; {start}"
    return f"{absent}; check the endpoint and the network to that host"
