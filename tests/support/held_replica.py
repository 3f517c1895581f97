"""A stage replica and its outbox in one runtime, as another (the engine, the next stage) refers
to them: for tests of what a replica holds and hands over, in memory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from troupe.runtime import Runtime
from troupe.runtime.core.ref import ActorRef
from troupe.runtime.lowlevel import MemoryHub
from troupe.runtime.pipeline.handoff import HELD, Outbox
from troupe.runtime.pipeline.stage import StageActor

__all__ = ["held_replica"]

BOUND = 10.0
NODE = "n"


@asynccontextmanager
async def held_replica(
    cls: type[StageActor], keys: Sequence[str]
) -> AsyncIterator[tuple[ActorRef, ActorRef]]:
    """A replica of ``cls`` and its outbox in runtime ``b``, as runtime ``a`` refers to them; the
    replica told its stage's name ("a"). What it held under ``keys`` is released after, and the
    process's pulls are let go again (the outbox's stop stopped them)."""
    hub = MemoryHub()
    try:
        async with (
            Runtime(NODE, "a", hub.transport(name="a"), ask_timeout=BOUND) as a,
            Runtime(NODE, "b", hub.transport(name="b"), drain_timeout=0.5) as b,
        ):
            refs = []
            for name, actor in (("stage", cls), ("outbox", Outbox)):
                await b.spawn(actor, name)
                a.directory.learn(f"{NODE}/b/{name}", b.cells[name].endpoint)
                refs.append(a.ref(f"{NODE}/b/{name}"))
            await refs[0].ask("stage_info", {"stage": "a"})
            yield refs[0], refs[1]
    finally:
        HELD.release(list(keys))
        await Outbox().started()  # this process's next replica pulls again
