"""A control message whose payload has no wire encoding fails its call with EncodeError and
leaves nothing behind: its reply's future had stayed registered, failed at its deadline or at
the runtime's stop with no one to see it ("Future exception was never retrieved ... ActorStopped"
after a job file's 20-digit integer)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import anyio
import pytest

from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.errors import EncodeError
from troupe.runtime.transports.loopback import free_endpoint

DEADLINE_S = 0.05


@pytest.mark.parametrize("payload", [object(), {"priority": 10**20}])
async def test_an_unencodable_control_fails_at_once_and_leaves_no_future(payload: Any) -> None:
    said: list[str] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: said.append(str(ctx.get("message"))))
    async with process_runtime("n", "p") as rt:
        with pytest.raises(EncodeError):
            await rt.control(free_endpoint(), "submit", payload, timeout=DEADLINE_S)
        await anyio.sleep(DEADLINE_S * 4)  # past the deadline an orphaned future would fail at
    gc.collect()
    assert not [m for m in said if "never retrieved" in m], said
