"""A runtime whose exit is cancelled while it waits for its tasks (a ``move_on_after`` around
the ``async with``) still closes its transport: it skipped the close, and the ZeroMQ context,
collected later with its sockets open, blocked the process in ``term()`` for good (a test's
``cluster.wait_for`` that timed out hung its pytest)."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.transports.base import MemoryHub, MemoryTransport

pytestmark = pytest.mark.anyio


class _SlowToStop(MemoryTransport):
    """Its serve task takes a moment to end once cancelled: until the test releases it."""

    def __init__(self, hub: MemoryHub, address: str) -> None:
        super().__init__(hub, address, 16)
        self.stopping = anyio.Event()
        self.release = anyio.Event()

    async def serve(self, on_message: Any, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await super().serve(on_message, task_status=task_status)
        finally:
            self.stopping.set()
            with anyio.CancelScope(shield=True), anyio.fail_after(30):
                await self.release.wait()


async def test_an_exit_cancelled_midway_still_closes_the_transport() -> None:
    transport = _SlowToStop(MemoryHub(), "mem://a")
    leaving, done_with_it = anyio.CancelScope(), anyio.Event()

    async def use() -> None:
        with leaving:
            async with Runtime("n", "p", transport, drain_timeout=0.1):
                await done_with_it.wait()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(use)
            done_with_it.set()
            await transport.stopping.wait()  # the exit waits for the serve task now
            leaving.cancel()
            await anyio.lowlevel.checkpoint()
            transport.release.set()
    assert transport.closed


class _SlowToStart(MemoryTransport):
    """Its serve task has not said it started until the test cancels the entry."""

    def __init__(self, hub: MemoryHub, address: str) -> None:
        super().__init__(hub, address, 16)
        self.starting = anyio.Event()

    async def serve(self, on_message: Any, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        self.starting.set()
        await anyio.sleep_forever()


async def test_an_entry_cancelled_while_the_transport_starts_leaves_the_caller_s_scopes_intact() -> None:
    """A ``move_on_after`` that ran out while the runtime entered (a test's ``cluster.wait_for``
    on a loaded machine) left the runtime's task group entered: leaving the caller's own scope then
    raised "Attempted to exit a cancel scope that isn't the current task's", not the timeout."""
    transport = _SlowToStart(MemoryHub(), "mem://a")
    entering = anyio.CancelScope()
    entered = False

    async def use() -> None:
        nonlocal entered
        with entering:
            async with Runtime("n", "p", transport, drain_timeout=0.1):
                entered = True

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(use)
            await transport.starting.wait()
            entering.cancel()
    assert entering.cancelled_caught and not entered
    assert transport.closed
