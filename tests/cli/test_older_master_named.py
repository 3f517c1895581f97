"""A control a master does not know (a master of a troupe from before it: ``retry_dead``, say)
is said as an older master's, where it was "is not a master (a node?)", which sent its operator
looking for another endpoint."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from troupe.cli.master_client import master_call
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.errors import UnknownMessageType

pytestmark = pytest.mark.anyio


async def _answering(ping: dict[str, Any]) -> str:
    """A peer that answers ``ping`` with ``ping`` and knows no other control."""
    async with process_runtime("m", "peer") as peer:

        async def pinged(_: Any) -> dict[str, Any]:
            return ping

        peer.register_control("ping", pinged)
        with anyio.fail_after(30), pytest.raises(UnknownMessageType) as refused:
            await master_call(peer.address, "retry_dead", {"job_id": "j"}, 10.0)
        return str(refused.value)


async def test_an_older_master_is_said_older() -> None:
    said = await _answering({"master": "master", "pid": 1})
    assert "has no 'retry_dead': it runs an older troupe than this command; upgrade it" in said


async def test_a_node_given_as_master_is_still_not_a_master() -> None:
    said = await _answering({"node": "n1", "pid": 1})
    assert "is not a master: it has no 'retry_dead' (a node?" in said
