"""The CLI's look at whether a master or node listens, over a slow or lossy link.

Every master command first tried a plain connect bounded at 0.5 s: over a link of 0.6 s round
trip, or one SYN lost (the kernel tries again after 1 s), it said "no master answers at E
(connection refused); start one", whatever --timeout, while the master served its nodes.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

import pytest

from troupe.cli import master_client
from troupe.cli.master_client import master_call, unreachable_why
from troupe.runtime import Unreachable

ENDPOINT = "tcp://10.139.0.1:22480"  # never dialled: the connects below are fakes


class _Connected:
    def __enter__(self) -> _Connected:
        return self

    def __exit__(self, *_: Any) -> None:
        return None


def _link(
    monkeypatch: pytest.MonkeyPatch, takes_s: float | None = None, error: OSError | None = None
) -> None:
    """Connects over a link whose handshake takes ``takes_s`` (a SYN lost once: about 1.2 s),
    or that fails with ``error``."""

    def create_connection(_address: Any, timeout: float) -> _Connected:
        if error is not None:
            raise error
        assert takes_s is not None
        if timeout < takes_s:
            raise TimeoutError("timed out")
        return _Connected()

    monkeypatch.setattr(socket, "create_connection", create_connection)


def test_a_connect_that_needs_a_second_syn_finds_the_master(monkeypatch: pytest.MonkeyPatch) -> None:
    _link(monkeypatch, takes_s=1.2)
    assert unreachable_why(ENDPOINT, "master") is None


def test_no_answer_to_the_connect_is_not_called_refused_nor_a_reason_to_start_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _link(monkeypatch, takes_s=1_000.0)
    absent = unreachable_why(ENDPOINT, "master")
    assert absent is not None
    assert "connection refused" not in absent and f"{master_client.PROBE_S:g} s" in absent
    said = master_client.what_to_do(absent, "start one")
    assert said.endswith("check the endpoint and the network to that host")


async def test_a_master_command_over_a_dead_route_says_the_route(monkeypatch: pytest.MonkeyPatch) -> None:
    _link(monkeypatch, error=OSError(errno.EHOSTUNREACH, "No route to host"))
    with pytest.raises(Unreachable) as err:
        await master_call(ENDPOINT, "status")
    said = str(err.value)
    assert f"no master answers at {ENDPOINT} (no route to host)" in said
    assert "troupe master start" not in said


def test_a_refused_connect_is_still_said_as_nothing_listening(monkeypatch: pytest.MonkeyPatch) -> None:
    _link(monkeypatch, error=ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))
    absent = unreachable_why(ENDPOINT, "master")
    assert absent == f"no master answers at {ENDPOINT} (connection refused)"
    assert master_client.what_to_do(absent, "start one") == f"{absent}; start one"
