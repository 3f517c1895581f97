"""Where a node's processes listen, and the address other hosts reach them at.

A node binds its endpoint; its workers bind the same interface on free ports, so that actors
on other hosts can reach their mailboxes directly (the data plane never passes through the
node or the master). A node that binds every interface (``tcp://0.0.0.0:7470``) cannot tell
other hosts a wildcard: its ``[node] advertise`` host names the address they reach it at, and
its workers bind that address.

A master started on its own binds its log stream the same way, on its endpoint's host
(:func:`any_port`); it has no ``advertise``, so a master bound on every interface tells a
wildcard, and ``troupe logs tail`` reaches it at the host it reached the master at.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from troupe.runtime.errors import ConfigError

__all__ = [
    "LOOPBACK_ANY_PORT",
    "advertised_endpoint",
    "any_port",
    "endpoint_host",
    "is_wildcard",
    "tcp_endpoint",
    "worker_bind",
]

LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"
_WILDCARDS = frozenset({"*", "0.0.0.0", "::", ""})


def endpoint_host(endpoint: str) -> str | None:
    """The host of a tcp endpoint (brackets of an IPv6 address removed), None for ipc/inproc."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp":
        return None
    # urlsplit takes "*" for no host; keep it, it is ZeroMQ's wildcard
    netloc = parts.netloc.rsplit(":", 1)[0] if ":" in parts.netloc else parts.netloc
    return netloc.strip("[]")


def tcp_endpoint(host: str, port: str) -> str:
    """``tcp://HOST:PORT``, an IPv6 host in brackets."""
    if ":" in host:  # IPv6: ZeroMQ wants it in brackets
        return f"tcp://[{host}]:{port}"
    return f"tcp://{host}:{port}"


def is_wildcard(endpoint: str) -> bool:
    """Whether a tcp endpoint binds every interface (``*``, ``0.0.0.0``, ``::``)."""
    host = endpoint_host(endpoint)
    return host is not None and host in _WILDCARDS


def _resolve(advertise: str) -> str:
    """The IP address of the ``advertise`` host (itself when it is one already).

    Raises:
        ConfigError: the name does not resolve.
    """
    try:
        ipaddress.ip_address(advertise)
        return advertise
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(advertise, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"node.advertise: cannot resolve {advertise!r} ({exc})") from None
    return str(infos[0][4][0])


def worker_bind(endpoint: str, advertise: str | None) -> str:
    """The endpoint a worker of the node at ``endpoint`` binds: the node's host, a free port.

    A loopback node keeps its workers on loopback; ipc and inproc nodes too. A node bound on
    every interface has its workers bind the ``advertise`` address.

    Raises:
        ConfigError: the node binds every interface and no ``advertise`` host is given, or it
            does not resolve.
    """
    host = endpoint_host(endpoint)
    if host is None:
        return LOOPBACK_ANY_PORT
    if host in _WILDCARDS:
        if not advertise:
            raise ConfigError(
                f"node.advertise: required when node.endpoint binds every interface "
                f"({endpoint!r}); give the address other hosts reach this one at"
            )
        return tcp_endpoint(_resolve(advertise), "*")
    return tcp_endpoint(host, "*")


def any_port(endpoint: str) -> str:
    """``endpoint``'s host on a free port, a wildcard host kept; ipc and inproc: loopback."""
    host = endpoint_host(endpoint)
    return LOOPBACK_ANY_PORT if host is None else tcp_endpoint(host, "*")


def advertised_endpoint(address: str, advertise: str | None) -> str:
    """``address`` (a socket's bound endpoint) as other hosts reach it: a wildcard host becomes
    ``advertise``; anything else is returned as it is."""
    host = endpoint_host(address)
    if host is None or host not in _WILDCARDS or not advertise:
        return address
    return tcp_endpoint(advertise, address.rsplit(":", 1)[1])
