"""A node at an IPv6 loopback endpoint (``tcp://[::1]:P``, which the config takes as loopback)
binds and answers: no socket asked ZeroMQ for IPv6, and its bind failed with "No such device;
is another node already running there?". A bind error says "another node" only for an address
in use (report cf 7)."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import anyio
import pytest

from support.local_node import echo_node_config
from troupe.runtime.core.client import connect
from troupe.runtime.errors import ConfigError, Unreachable
from troupe.runtime.node.local import start_local_node
from troupe.runtime.transports.zmq import ZmqTransport

BOUND_S = 120.0  # against a hang only


def _free_ipv6_port() -> int:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            return int(probe.getsockname()[1])
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")


async def test_a_node_at_an_ipv6_loopback_endpoint_answers(tmp_path: Path) -> None:
    endpoint = f"tcp://[::1]:{_free_ipv6_port()}"
    cfg = echo_node_config(tmp_path, "six", endpoint=endpoint)
    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            node = await start_local_node(tg, cfg)
            async with connect(endpoint) as rt:
                assert await rt.ref("echo").ask("echo", "over ::1", timeout=30) == "over ::1"
            node.stopping.set()
            await node.stopped.wait()


def test_a_taken_address_is_said_apart_from_other_bind_errors(tmp_path: Path) -> None:
    first = ZmqTransport(bind=f"ipc://{tmp_path / 'n.sock'}")
    try:
        with pytest.raises(Unreachable) as taken:
            ZmqTransport(bind=first.address)
    finally:
        first.close()
    assert taken.value.errno in (errno.EADDRINUSE, None)  # ipc: refused before ZeroMQ binds
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        with pytest.raises(Unreachable) as in_use:
            ZmqTransport(bind=f"tcp://127.0.0.1:{held.getsockname()[1]}")
    assert in_use.value.errno == errno.EADDRINUSE
    with pytest.raises(Unreachable) as not_here:
        ZmqTransport(bind="tcp://192.0.2.1:5555")  # TEST-NET-1: no address of this host
    assert not_here.value.errno == errno.EADDRNOTAVAIL


async def test_a_node_whose_address_is_not_this_host_s_is_not_told_of_another_node(tmp_path: Path) -> None:
    from troupe.runtime.node.node import bind_refused

    err = Unreachable("cannot bind a mailbox at tcp://192.0.2.1:5555: Cannot assign requested address")
    err.errno = errno.EADDRNOTAVAIL
    said = str(bind_refused(err))
    assert "another node" not in said and "pick another --endpoint" in said
    err.errno = errno.EADDRINUSE
    assert "is another node already running there?" in str(bind_refused(err))
    assert isinstance(bind_refused(err), ConfigError)
