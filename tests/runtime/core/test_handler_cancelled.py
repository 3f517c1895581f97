"""A CancelledError the handler's own code met (it awaited a task cancelled elsewhere, raised
one, or cancelled its own task) is that handler's failure, not the runtime's shutdown: its
asker gets a RemoteError, the failure is logged, and the process and its other actors go on. It
was read as the shutdown, re-raised, and ended the whole worker: every other actor's in-flight
ask failed with ActorStopped. A handler that cancels its own task (``asyncio.current_task().cancel()``) still
did so after the cell told the runtime's cancellation from others by ``Task.cancelling()``,
which its own cancel makes non-zero. A handler cut off by the real shutdown still answers ActorStopped
(test_actor_semantics.py: test_in_flight_*_ask_fails_with_actor_stopped).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog

from troupe.runtime import Actor, ActorRef, RemoteError, Runtime, handles
from troupe.runtime.lowlevel import MemoryHub

BOUND = 5.0
NODE = "n"


class Aborted(Actor):
    """Handlers that meet a CancelledError of their own making."""

    @handles("awaits_cancelled")
    async def awaits_cancelled(self, _: Any) -> Any:
        loop = asyncio.get_running_loop()
        job = loop.create_task(asyncio.Event().wait())  # a download...
        loop.call_soon(job.cancel)  # ...aborted elsewhere
        return await job

    @handles("raises_async")
    async def raises_async(self, _: Any) -> None:
        await anyio.lowlevel.checkpoint()
        raise asyncio.CancelledError("aborted")

    @handles("cancels_itself")
    async def cancels_itself(self, _: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)

    @handles("cancelling")
    async def cancelling(self, _: Any) -> int:
        """What the actor's task still holds of an earlier handler's cancellation."""
        task = asyncio.current_task()
        assert task is not None
        with anyio.fail_after(BOUND):  # a scope of anyio's on a task with a count left
            await anyio.lowlevel.checkpoint()
        return task.cancelling()

    @handles("raises_sync")
    def raises_sync(self, _: Any) -> None:
        raise asyncio.CancelledError("aborted")

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload


class Bystander(Actor):
    """Another actor of the same process, busy with an ask while its neighbour fails."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()

    @handles("hold")
    async def hold(self, payload: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return payload


@asynccontextmanager
async def _runtimes() -> AsyncIterator[tuple[Runtime, Runtime]]:
    """``a`` asks; ``b`` hosts "aborted" and "bystander", both waiting for mail."""
    hub = MemoryHub()
    async with (
        Runtime(NODE, "a", hub.transport(name="a"), ask_timeout=BOUND) as a,
        Runtime(NODE, "b", hub.transport(name="b"), drain_timeout=0.5) as b,
    ):
        await b.spawn(Aborted, "aborted")
        await b.spawn(Bystander(), "bystander")
        for name in ("aborted", "bystander"):
            a.directory.learn(f"{NODE}/b/{name}", b.cells[name].endpoint)
            while not b.cells[name].idle():
                await anyio.lowlevel.checkpoint()
        yield a, b


def _ref(a: Runtime, b: Runtime, path: str, name: str) -> ActorRef:
    return a.ref(f"{NODE}/b/{name}") if path == "remote" else b.ref(name)


@pytest.mark.parametrize("path", ["local", "remote"])
@pytest.mark.parametrize("handler", ["awaits_cancelled", "raises_async", "raises_sync", "cancels_itself"])
async def test_a_handler_s_own_cancelled_error_is_its_failure_and_spares_its_neighbours(
    handler: str, path: str
) -> None:
    answers: list[Any] = []
    with anyio.fail_after(BOUND), structlog.testing.capture_logs() as logs:
        async with _runtimes() as (a, b), anyio.create_task_group() as tg:
            bystander = b.cells["bystander"].actor
            assert isinstance(bystander, Bystander)

            async def ask_bystander() -> None:
                answers.append(await a.ref(f"{NODE}/b/bystander").ask("hold", "spared"))

            tg.start_soon(ask_bystander)
            await bystander.entered.wait()
            ref = _ref(a, b, path, "aborted")
            with pytest.raises(RemoteError) as caught:
                await ref.ask(handler)
            await ref.tell(handler)  # no one to answer: logged
            assert await ref.ask("echo", "still here") == "still here"
            assert await ref.ask("cancelling") == 0  # the actor's task holds none of it
            bystander.release.set()
        failed = b.statistics().actors["aborted"]["failed"]
    assert caught.value.remote_type == "asyncio.exceptions.CancelledError"
    assert caught.value.actor == f"{NODE}/b/aborted"
    assert answers == ["spared"]  # the neighbour's in-flight ask came through
    assert failed == 2
    events = [(e["event"], e.get("type")) for e in logs if e["event"] in ("handler_raised", "handler_failed")]
    assert events == [("handler_raised", handler), ("handler_failed", handler)], events
