"""`troupe ctl` over a slow link: a new connection with CURVE keys answers its first ask after
about seven seconds at a second's round trip (nw 3). `ctl ping` failed at the default 5 s,
blaming a hung node or the keys; `ctl submit`'s look at the master was capped at 5 s whatever
`--timeout` said. The look honours `--timeout`, and the silence names the slow link, with a
longer `--timeout` to try, where the CLI's own connect was slow.

The link is a fake: its connect and its replies take what the test says, on a clock of its own.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from troupe.cli import client, endpoint_probe, master_client
from troupe.cli.client import control
from troupe.cli.master_client import SLOW_CONNECT_S, master_call, submit_job
from troupe.runtime import AskTimeout

pytestmark = pytest.mark.anyio

ENDPOINT = "tcp://10.139.0.1:22480"  # never dialled: the connects and asks below are fakes


class _Link:
    """A link whose connect takes ``connect_s`` and whose first reply comes ``first_reply_s``
    after the ask (the handshakes), on a clock of its own."""

    def __init__(self, connect_s: float, first_reply_s: float) -> None:
        self.now = 0.0
        self.connect_s = connect_s
        self.first_reply_s = first_reply_s
        self.asked: list[tuple[str, float]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        link = self

        class _Connected:
            def __enter__(self) -> _Connected:
                link.now += link.connect_s
                return self

            def __exit__(self, *_: Any) -> None:
                return None

            def settimeout(self, _timeout: float) -> None:
                return None

            def recv(self, _size: int) -> bytes:  # a ZeroMQ peer's greeting (zmtp_greeting)
                return b"\xff" + bytes(8) + b"\x7f"

        class _Runtime:
            async def control(self, endpoint: str, msg_type: str, payload: Any = None, **kw: Any) -> Any:
                link.asked.append((msg_type, kw["timeout"]))
                if kw["timeout"] < link.first_reply_s:
                    raise AskTimeout(f"no reply to {msg_type!r} from {endpoint} within {kw['timeout']}s")
                link.first_reply_s = 0.0  # the connection is up: the next ask is a round trip
                if msg_type == "ping":
                    return {"master": "master", "pid": 1}
                return {"job_id": "j", "tasks": 1, "already": False}

        @asynccontextmanager
        async def cli_runtime() -> AsyncIterator[_Runtime]:
            yield _Runtime()

        monkeypatch.setattr(socket, "create_connection", lambda _address, _timeout: _Connected())
        monkeypatch.setattr(endpoint_probe, "_clock", lambda: link.now)  # the probe's connect
        monkeypatch.setattr(master_client, "cli_runtime", cli_runtime)
        monkeypatch.setattr(client, "cli_runtime", cli_runtime)


JOB = {"job": {"job": {"name": "j", "kind": "k", "count": 1}}, "source": "test"}


async def test_the_look_before_a_submit_waits_as_long_as_timeout_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    link = _Link(connect_s=1.2, first_reply_s=7.2)
    link.install(monkeypatch)
    reply = await submit_job(ENDPOINT, JOB, timeout=60.0)
    assert reply["job_id"] == "j"
    assert link.asked == [("ping", 60.0), ("submit", 60.0)]


async def test_a_node_silent_over_a_slow_link_is_said_to_be_behind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _Link(connect_s=1.2, first_reply_s=7.2).install(monkeypatch)
    with pytest.raises(AskTimeout) as caught:
        await control(ENDPOINT, "ping", timeout=5.0)
    said = str(caught.value)
    assert said.startswith(f"the node at {ENDPOINT} did not answer within 5.0s: the link to it may be slow")
    assert "the connect alone took 1.2 s" in said and "try --timeout 30" in said
    assert "if it still does not answer, it accepts connections, so it runs, but it is busy" in said


@pytest.mark.parametrize("call", ["master_call", "submit_job"])
async def test_a_master_silent_over_a_slow_link_is_said_to_be_behind_it(
    call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _Link(connect_s=1.2, first_reply_s=7.2).install(monkeypatch)
    with pytest.raises(AskTimeout) as caught:
        if call == "master_call":
            await master_call(ENDPOINT, "jobs", timeout=5.0)
        else:
            await submit_job(ENDPOINT, JOB, timeout=5.0)
    said = str(caught.value)
    assert said.startswith(f"the master at {ENDPOINT} did not answer (no ")
    assert "the link to it may be slow: the connect alone took 1.2 s" in said and "try --timeout 30" in said


async def test_a_silence_after_a_fast_connect_names_no_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connect of a LAN (a millisecond): the link is not the matter, as before."""
    _Link(connect_s=SLOW_CONNECT_S / 100, first_reply_s=1_000.0).install(monkeypatch)
    with pytest.raises(AskTimeout) as caught:
        await control(ENDPOINT, "ping", timeout=5.0)
    said = str(caught.value)
    assert said.startswith(f"the node at {ENDPOINT} did not answer within 5.0s: it accepts connections")
    assert "link" not in said and "--timeout" not in said
