"""The address this host reaches a peer from: what a process listens on for that peer to call it
back, where its host name or loopback would send the peer to its own host."""

from __future__ import annotations

import socket

__all__ = ["source_address"]


def source_address(peer: str) -> str | None:
    """The local address a packet to ``peer`` (a host name or address) leaves from (a datagram
    socket's connect picks the route and sends nothing); None where there is no route or
    ``peer`` does not resolve."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(peer, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(where)
            return str(probe.getsockname()[0]).split("%")[0]
    except OSError:
        return None
