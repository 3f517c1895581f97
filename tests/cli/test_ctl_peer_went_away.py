"""`troupe ctl` (and a cluster run's look at the master's nodes) to a node or master that goes
while it asks: the error says it went away (it stopped or died), not that nothing answered
within the timeout, and offers no key hint."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from support.raw_peer import RawPeer, goes_mid_call
from troupe.cli.client import control
from troupe.cli.master_client import master_call
from troupe.runtime import PeerLost, TroupeError, Unreachable
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.placement import cluster_hosts

Call = Callable[[str], Awaitable[Any]]


async def _goes_while_asked(call: Call) -> tuple[BaseException | None, str]:
    with RawPeer() as peer:
        return await goes_mid_call(peer, lambda: call(peer.endpoint)), peer.endpoint


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
    assert isinstance(error, PeerLost), error
    message = str(error)
    assert message.startswith(said.format(ep=endpoint)), message
    assert "within" not in message and "keys" not in message, message


async def test_a_master_that_goes_while_a_run_asks_for_its_nodes_is_said_to_have_gone() -> None:
    async with process_runtime("cli", "run") as rt:
        error, endpoint = await _goes_while_asked(lambda ep: cluster_hosts(rt, ep, timeout=3600))
    assert isinstance(error, Unreachable), error
    assert str(error).startswith(f"the master at {endpoint} went away before it answered"), error


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda ep: control(ep, "status", timeout=0.3), "the node at {ep} did not answer within 0.3s"),
        (lambda ep: master_call(ep, "jobs", timeout=0.3), "the master at {ep} did not answer (no reply"),
    ],
    ids=["node", "master"],
)
async def test_a_peer_that_listens_and_never_answers_is_said_to_run_not_told_to_be_started(
    call: Call, said: str
) -> None:
    """A paused or busy process (here a peer that reads and never answers): the error said no
    node or master answers, and to start one, while one ran."""
    with RawPeer() as peer:
        with pytest.raises(TroupeError) as caught:
            await call(peer.endpoint)
        message = str(caught.value)
    assert message.startswith(said.format(ep=peer.endpoint)), message
    assert "busy, paused (SIGSTOP) or hung" in message and "start one" not in message, message
