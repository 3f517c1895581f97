"""``Actor.stop_requested`` runs when shutdown begins, before the mailbox drains: a handler
waiting on something the hook ends finishes at once, instead of holding the drain up to its
deadline; ``stopping`` still runs after the drain."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from troupe.runtime import Actor, handles
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.transports.base import MemoryHub

pytestmark = pytest.mark.anyio


class _Waits(Actor):
    def __init__(self) -> None:
        self.busy = anyio.Event()
        self.release = anyio.Event()
        self.calls: list[str] = []

    @handles("wait")
    async def wait(self, _: Any) -> None:
        self.busy.set()
        await self.release.wait()
        self.calls.append("handled")

    def stop_requested(self) -> None:
        self.calls.append("stop_requested")
        self.release.set()

    async def stopping(self) -> None:
        self.calls.append("stopping")


class _Raises(Actor):
    def stop_requested(self) -> None:
        raise RuntimeError("broken hook")


async def test_the_hook_ends_a_wait_before_the_drain_and_stopping_runs_after() -> None:
    # A drain deadline far past the test's bound: only the hook lets the stop end in time.
    with anyio.fail_after(30):
        async with Runtime("n", "p", MemoryHub().transport(), drain_timeout=3600) as rt:
            await rt.spawn(_Raises, "r")  # a hook that raises is logged; the others still run
            ref = await rt.spawn(_Waits, "w")
            actor = rt.cells["w"].actor
            assert isinstance(actor, _Waits)
            await ref.tell("wait", None)
            await actor.busy.wait()
    assert actor.calls == ["stop_requested", "handled", "stopping"]
