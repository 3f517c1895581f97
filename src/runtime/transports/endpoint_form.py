"""The form of an endpoint, checked before anything binds or connects to it: ``tcp://HOST:PORT``,
``ipc://PATH`` or ``inproc://NAME``. Here, under transports, so that the runtime's own ``connect``
checks what a program gives it as a node's config and the CLI check theirs.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from .ipc_socket import path_length_problem

__all__ = ["check_endpoint"]


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` as given, if it is ``tcp://HOST:PORT`` (PORT 1-65535, or ``*`` to bind any),
    ``ipc://PATH`` or ``inproc://NAME``.

    Raises:
        ValueError: it is not; the message names it and the expected form. A port past 65535
            had been taken modulo 65536 by the bind (99999 bound 34463), and crashed a connect.
            An ipc path too long for a Unix socket is refused with the limit (``ipc_socket``).
    """
    expected = f"endpoint {endpoint!r} must be tcp://HOST:PORT (PORT 1-65535), ipc://PATH or inproc://NAME"
    try:
        parts = urlsplit(endpoint)
    except ValueError:  # urllib's words alone ("Invalid IPv6 URL") lost what was typed
        raise ValueError(expected) from None
    if parts.scheme in ("ipc", "inproc") and (parts.netloc or parts.path):
        too_long = path_length_problem(parts.netloc + parts.path) if parts.scheme == "ipc" else None
        if too_long is not None:
            raise ValueError(f"endpoint {endpoint!r}: {too_long}")
        return endpoint
    if parts.scheme != "tcp" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(expected)
    if parts.netloc.rpartition(":")[2] == "*":
        return endpoint
    try:
        port = parts.port
    except ValueError:
        raise ValueError(expected) from None
    if not port:  # missing, or 0
        raise ValueError(expected)
    return endpoint
