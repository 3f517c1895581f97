"""`troupe ctl` with no --node, nothing at its default, while a `troupe run` listens at its
own default: the error names where the run's node is, not `troupe node start` (a user who just
started `troupe run` was sent to start a node); its master's views (no --master) name the run's
master likewise. With --node (--master) given, the plain error stays."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest

from troupe.cli import client as cli_client
from troupe.cli import master_client
from troupe.cli.client import control
from troupe.cli.master_client import master_call
from troupe.runtime import Unreachable
from troupe.runtime.transports.loopback import free_endpoint


@pytest.fixture
def run_listening(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A listener standing in for a `troupe run`'s node; ctl's default endpoint has nobody."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    run = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    nobody = free_endpoint()
    monkeypatch.setattr(cli_client, "RUN_NODE_ENDPOINT", run)
    monkeypatch.setattr(cli_client, "DEFAULT_NODE_ENDPOINT", nobody)
    try:
        yield nobody
    finally:
        sock.close()


async def test_no_node_given_names_the_run_s_node(run_listening: str) -> None:
    with pytest.raises(Unreachable) as err:
        await control(run_listening, "ping", timeout=5)
    said = str(err.value)
    assert f"no node answers at {run_listening}; a node listens at {cli_client.RUN_NODE_ENDPOINT}" in said
    assert f"pass --node {cli_client.RUN_NODE_ENDPOINT}" in said and "troupe node start" not in said


async def test_a_node_given_that_does_not_answer_is_said_as_before(run_listening: str) -> None:
    given = free_endpoint()
    with pytest.raises(
        Unreachable,
        match=re.escape(
            f"no node answers at {given} (connection refused); start one with `troupe node start`"
        ),
    ):
        await control(given, "ping", timeout=5)


async def test_no_master_given_names_the_run_s_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """Report sh 9: `ctl jobs` (and `cancel`, `dead`) with no --master during a one-host run
    said "start one with `troupe master start`", with no word of the run's master."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    run = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    nobody = free_endpoint()
    monkeypatch.setattr(master_client, "RUN_MASTER_ENDPOINT", run)
    monkeypatch.setattr(master_client, "DEFAULT_MASTER_ENDPOINT", nobody)
    try:
        with pytest.raises(Unreachable) as err:
            await master_call(nobody, "jobs", timeout=5)
        said = str(err.value)
        assert f"no master answers at {nobody} (connection refused); a master listens at {run}" in said
        assert f"pass --master {run}" in said and "troupe master start" not in said
        given = free_endpoint()
        with pytest.raises(Unreachable, match="start one with `troupe master start`"):
            await master_call(given, "jobs", timeout=5)
    finally:
        sock.close()
