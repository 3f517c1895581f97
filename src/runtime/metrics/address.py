"""The ``HOST:PORT`` a Prometheus endpoint listens on (``[node] metrics``, ``--metrics``).

Plain HTTP, not a ZeroMQ endpoint, so it has no ``tcp://``; an IPv6 host is written in
brackets (``[::1]:9464``), as in a URL.
"""

from __future__ import annotations

__all__ = ["DEFAULT_METRICS_PORT", "as_endpoint", "parse_host_port"]

DEFAULT_METRICS_PORT = 9464  # Prometheus' registry of default ports lists 9464 for exporters


def parse_host_port(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` into its host and port (port 0: any free port).

    Raises:
        ValueError: not ``HOST:PORT`` with a port from 0 to 65535; names the value.
    """
    example = f"e.g. 127.0.0.1:{DEFAULT_METRICS_PORT}"
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r} must be HOST:PORT with an IPv6 host in brackets ([::1]:PORT)")
    if not sep or not host or "/" in host or " " in host:
        raise ValueError(f"{text!r} must be HOST:PORT ({example})")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number from 0 to 65535 ({example})")
    return host, int(port_text)


def as_endpoint(host: str, port: int) -> str:
    """``tcp://HOST:PORT`` for the same address, for the rules written for endpoints."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
