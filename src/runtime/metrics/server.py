"""The HTTP endpoint Prometheus scrapes: ``GET /metrics`` on the process's own event loop.

Not prometheus-client's own server: that one answers from a thread of its own, which would read
the node's and the master's state while the event loop changes it. Here a scrape is a task of
the loop: it refreshes what the collectors fetch from other processes, then renders the
process's private registry (never the global default one: tests run several nodes in one
process).

The socket is bound when the server is made, so a port in use is an error at start (one line,
:class:`~troupe.runtime.errors.ConfigError`), not a surprise later. A request is read up to
``MAX_REQUEST_BYTES`` within ``READ_TIMEOUT_S`` of its connection's accept; anything else
(another method, another path, a request too large or too slow, a client gone) is answered with
its HTTP status or dropped, logged once a minute per kind with how many there were, and never
stops the server. Connections are read at once, each its own task: clients that connect and say
nothing cost a scrape nothing (only the rendering is bounded, ``_MAX_RENDERING`` at a time), and
past ``MAX_OPEN`` connections open, a new one is closed at once (a client holding thousands open
had taken the node's file descriptors).
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.abc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from troupe.runtime.errors import ConfigError
from troupe.runtime.library_logging import get_logger

from .address import parse_host_port

__all__ = ["MAX_OPEN", "MAX_REQUEST_BYTES", "READ_TIMEOUT_S", "MetricsServer"]

log = get_logger(__name__)

MAX_REQUEST_BYTES = 8192
READ_TIMEOUT_S = 5.0
REFRESH_TIMEOUT_S = 3.0  # a scrape never waits longer than this on the node's other processes
_MAX_RENDERING = 16  # scrapes rendered at once
MAX_OPEN = 128  # connections open at once; a new one past them is closed unread
SAY_EVERY_S = 60.0  # a kind of dropped request is logged at most this often, with its count

Refresh = Callable[[], Awaitable[None]]


class MetricsServer:
    """Serves ``registry`` at ``http://ADDRESS/metrics``.

    Args:
        address: ``HOST:PORT`` to listen on (port 0: any free port; see :attr:`address`).
        registry: the collectors to render.
        refreshers: called (concurrently) before each scrape renders, to fetch what the
            collectors read from other processes; bounded by ``REFRESH_TIMEOUT_S``.
        who: what serves (``node``, ``master``), for messages.

    Raises:
        ConfigError: ``address`` is malformed or cannot be bound (in use, not an address here).
    """

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        refreshers: Sequence[Refresh] = (),
        who: str = "node",
    ) -> None:
        try:
            host, port = parse_host_port(address)
        except ValueError as exc:
            raise ConfigError(f"metrics: {exc}") from None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # A port whose last scrape lingers in TIME_WAIT is free; one with a listener is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(64)
        except OSError as exc:
            sock.close()
            raise ConfigError(
                f"metrics {address}: cannot listen there ({exc.strerror or exc}); is another troupe "
                f"{who} using it? pass another --metrics HOST:PORT"
            ) from None
        sock.setblocking(False)
        self._sock: socket.socket | None = sock
        self._registry = registry
        self._refreshers = list(refreshers)
        self._refreshing = anyio.Lock()
        self._limit = anyio.CapacityLimiter(_MAX_RENDERING)
        self._open = 0
        self._dropped: Counter[str] = Counter()  # by kind, since it was last said
        self._said: dict[str, float] = {}  # kind -> when it was last said
        bound = sock.getsockname()[1]
        self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        self.scrapes = 0

    @property
    def url(self) -> str:
        """Where Prometheus scrapes: ``http://HOST:PORT/metrics``."""
        return f"http://{self.address}/metrics"

    async def serve(self) -> None:
        """Answer scrapes until cancelled; the socket is closed on the way out."""
        sock, self._sock = self._sock, None
        if sock is None:
            raise RuntimeError("MetricsServer.serve() called twice, or after close()")
        listener = await anyio.abc.SocketListener.from_socket(sock)
        log.info("metrics_serving", url=self.url)
        async with listener:
            await listener.serve(self._connection)

    def close(self) -> None:
        """Close the socket if :meth:`serve` never took it; idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            if self._open >= MAX_OPEN:
                self._drop("metrics_connection_refused", f"{MAX_OPEN} connections were open already")
                return
            self._open += 1
            try:
                await self._answer(stream)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError):
                pass  # the client went away: nothing to answer
            except Exception as exc:  # a bug here must cost one scrape, not the endpoint
                log.error("metrics_request_failed", error=repr(exc))
            finally:
                self._open -= 1

    def _drop(self, kind: str, why: str) -> None:
        """Count a request dropped or refused; say its kind at most once a minute, with the count."""
        self._dropped[kind] += 1
        now = time.monotonic()
        if now - self._said.get(kind, -SAY_EVERY_S) >= SAY_EVERY_S:
            self._said[kind] = now
            log.warning(kind, why=why, count=self._dropped.pop(kind), url=self.url)

    async def _answer(self, stream: anyio.abc.SocketStream) -> None:
        head = b""
        with anyio.move_on_after(READ_TIMEOUT_S) as reading:
            while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) <= MAX_REQUEST_BYTES:
                head += await stream.receive(4096)
        if reading.cancelled_caught:  # said nothing whole in time: nobody to answer
            self._drop("metrics_request_slow", f"no whole request within {READ_TIMEOUT_S:g}s")
            return
        if len(head) > MAX_REQUEST_BYTES:
            self._drop("metrics_request_too_large", f"a request header past {MAX_REQUEST_BYTES} bytes")
            await _send(stream, 431, "text/plain", b"request header too large\n")
            return
        request = head.split(b"\n", 1)[0].decode("latin-1").split()
        if len(request) != 3 or not request[2].startswith("HTTP/"):
            self._drop("metrics_request_bad", "not an HTTP request")
            await _send(stream, 400, "text/plain", b"expected an HTTP request: GET /metrics\n")
            return
        method, target = request[0], request[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            await _send(stream, 405, "text/plain", b"only GET /metrics\n", {"Allow": "GET, HEAD"})
            return
        if target not in ("/metrics", "/"):
            await _send(stream, 404, "text/plain", b"not found; the metrics are at /metrics\n")
            return
        if target == "/":
            await _send(
                stream, 200, "text/plain", b"troupe metrics: GET /metrics\n", head_only=method == "HEAD"
            )
            return
        async with self._limit:
            body = await self.render()
            await _send(stream, 200, CONTENT_TYPE_LATEST, body, head_only=method == "HEAD")

    async def render(self) -> bytes:
        """Refresh the collectors (bounded), then render the registry as Prometheus text."""
        async with self._refreshing:
            with anyio.move_on_after(REFRESH_TIMEOUT_S):
                async with anyio.create_task_group() as tg:
                    for refresh in self._refreshers:
                        tg.start_soon(_refresh_quietly, refresh)
            self.scrapes += 1
            return generate_latest(self._registry)


async def _refresh_quietly(refresh: Refresh) -> None:
    try:
        await refresh()
    except Exception as exc:  # the scrape goes on with what the collectors had
        log.warning("metrics_refresh_failed", error=repr(exc))


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
}


async def _send(
    stream: anyio.abc.SocketStream,
    status: int,
    content_type: str,
    body: bytes,
    headers: dict[str, Any] | None = None,
    head_only: bool = False,
) -> None:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, '')}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body))
