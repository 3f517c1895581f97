"""The metrics HTTP endpoint: GET /metrics renders the private registry after refreshing the
collectors; anything else gets its HTTP status; a port in use is a one-line error at start; a
slow refresher or a bad request never holds the endpoint up."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import pytest
import structlog.testing
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from troupe.runtime.errors import ConfigError
from troupe.runtime.metrics import server as server_module
from troupe.runtime.metrics.server import MAX_REQUEST_BYTES, MetricsServer
from troupe.runtime.metrics.serving import serving


class Counted:
    """A collector whose value is what its refresh last fetched."""

    def __init__(self) -> None:
        self.refreshes = 0

    async def refresh(self) -> None:
        self.refreshes += 1

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("test_refreshes", "Refreshes so far.", value=self.refreshes)


async def request(address: str, raw: bytes) -> tuple[int, bytes]:
    """Send ``raw`` and read the whole answer (the server closes after one)."""
    host, port = address.rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as stream:
        await stream.send(raw)
        data = b""
        with anyio.fail_after(10):
            try:
                while True:
                    data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@asynccontextmanager
async def served(collector: Counted) -> AsyncIterator[MetricsServer]:
    registry = CollectorRegistry()
    registry.register(collector)
    server = MetricsServer("127.0.0.1:0", registry, [collector.refresh])
    async with serving(server):
        yield server


async def test_get_metrics_refreshes_then_renders_text_prometheus_parses() -> None:
    collector = Counted()
    async with served(collector) as server:
        for expected in (1, 2):
            status, body = await request(server.address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200
            (family,) = text_string_to_metric_families(body.decode())
            assert family.name == "test_refreshes" and family.samples[0].value == expected


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /other HTTP/1.1\r\n\r\n", 404),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"\x00\xff garbage\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (MAX_REQUEST_BYTES + 10) + b"\r\n\r\n", 431),
    ],
)
async def test_other_requests_get_their_status_and_the_endpoint_serves_on(raw: bytes, status: int) -> None:
    collector = Counted()
    async with served(collector) as server:
        assert (await request(server.address, raw))[0] == status
        assert (await request(server.address, b"GET /metrics HTTP/1.0\r\n\r\n"))[0] == 200


async def test_a_client_that_says_nothing_and_leaves_costs_nothing() -> None:
    collector = Counted()
    async with served(collector) as server:
        host, port = server.address.rsplit(":", 1)
        async with await anyio.connect_tcp(host, int(port)):
            pass  # connects and leaves without a word
        assert (await request(server.address, b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 200


async def test_a_refresher_that_hangs_delays_a_scrape_by_the_bound_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server_module, "REFRESH_TIMEOUT_S", 0.05)

    async def hangs() -> None:
        await anyio.sleep_forever()

    async def fails() -> None:
        raise RuntimeError("peer gone")

    registry = CollectorRegistry()
    registry.register(Counted())
    server = MetricsServer("127.0.0.1:0", registry, [hangs, fails])
    async with serving(server):
        status, body = await request(server.address, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert status == 200 and b"test_refreshes" in body


def test_a_port_in_use_is_one_line_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as caught:
            MetricsServer(f"127.0.0.1:{port}", CollectorRegistry())
    text = str(caught.value)
    assert f"metrics 127.0.0.1:{port}: cannot listen there" in text and "--metrics" in text
    assert "\n" not in text


async def test_the_socket_is_closed_when_the_block_ends_even_unserved() -> None:
    server = MetricsServer("127.0.0.1:0", CollectorRegistry())
    address = server.address
    with pytest.raises(RuntimeError, match="boom"):
        async with serving(server):
            raise RuntimeError("boom")
    again = MetricsServer(address, CollectorRegistry())  # the port is free again
    again.close()


async def _idle(address: str, n: int, stack: contextlib.AsyncExitStack) -> None:
    """``n`` clients that connect, send a byte of a request, and say no more."""
    host, port = address.rsplit(":", 1)
    for _ in range(n):
        stream = await stack.enter_async_context(await anyio.connect_tcp(host, int(port)))
        await stream.send(b"G")


async def test_clients_that_connect_and_say_nothing_hold_no_scrape_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forty half-requests: each held one of the sixteen places until its read timed out, and a
    scrape behind them waited (10 s, Prometheus's own timeout). Requests are read at once now."""
    monkeypatch.setattr(server_module, "READ_TIMEOUT_S", 3600.0)  # they never time out here
    async with served(Counted()) as server, contextlib.AsyncExitStack() as idle:
        await _idle(server.address, 40, idle)
        with anyio.fail_after(60):  # a bound on a hang only: the scrape is not behind them
            assert (await request(server.address, b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 200


async def test_connections_past_the_bound_are_closed_at_once_and_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three thousand idle connections held 2,935 descriptors of the node, unlogged."""
    monkeypatch.setattr(server_module, "READ_TIMEOUT_S", 3600.0)
    monkeypatch.setattr(server_module, "MAX_OPEN", 4)
    with structlog.testing.capture_logs() as logs:
        async with served(Counted()) as server:
            async with contextlib.AsyncExitStack() as idle:
                await _idle(server.address, 4, idle)
                with anyio.fail_after(30):
                    while server._open < 4:  # accepted, each read under way
                        await anyio.sleep(0.01)
                for _ in range(3):
                    host, port = server.address.rsplit(":", 1)
                    async with await anyio.connect_tcp(host, int(port)) as refused:
                        with (
                            anyio.fail_after(30),
                            pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)),
                        ):
                            await refused.receive()  # closed unread
            with anyio.fail_after(30):
                while server._open:  # the idle ones gone: their places are free again
                    await anyio.sleep(0.01)
            assert (await request(server.address, b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 200
    said = [e for e in logs if e["event"] == "metrics_connection_refused"]
    assert [(e["log_level"], e["count"]) for e in said] == [("warning", 1)]  # once a minute, counted


async def test_a_request_never_finished_is_dropped_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "READ_TIMEOUT_S", 0.2)
    with structlog.testing.capture_logs() as logs:
        async with served(Counted()) as server, contextlib.AsyncExitStack() as idle:
            await _idle(server.address, 1, idle)
            with anyio.fail_after(30):
                while not any(e["event"] == "metrics_request_slow" for e in logs):
                    await anyio.sleep(0.01)
            assert (await request(server.address, b"GET /metrics HTTP/1.1\r\n\r\n"))[0] == 200
