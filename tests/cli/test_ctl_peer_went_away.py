"""`troupe ctl` to a node or master that goes while it asks: the error says it went away (it
stopped or died), not that nothing answered within the timeout, and offers no key hint."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from support.raw_peer import WITHIN_S, RawPeer
from troupe.cli.client import control
from troupe.cli.master_client import master_call
from troupe.runtime import PeerLost

Call = Callable[[str], Awaitable[Any]]


async def _goes_while_asked(call: Call) -> tuple[PeerLost, str]:
    ended: list[BaseException] = []
    with RawPeer() as peer:

        async def ask() -> None:
            try:
                await call(peer.endpoint)
            except PeerLost as exc:
                ended.append(exc)

        with anyio.fail_after(WITHIN_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await anyio.to_thread.run_sync(peer.receive)
                peer.die()
    assert len(ended) == 1, "the call did not end with PeerLost"
    error = ended[0]
    assert isinstance(error, PeerLost)
    return error, peer.endpoint


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda ep: control(ep, "status", timeout=3600), "the node at {ep} went away before it answered"),
        (
            lambda ep: master_call(ep, "jobs", timeout=3600),
            "no master answers at {ep} (it went away before it answered: it stopped or died)",
        ),
    ],
    ids=["node", "master"],
)
async def test_a_peer_that_goes_mid_call_is_said_to_have_gone(call: Call, said: str) -> None:
    error, endpoint = await _goes_while_asked(call)
    message = str(error)
    assert message.startswith(said.format(ep=endpoint)), message
    assert "within" not in message and "keys" not in message, message
