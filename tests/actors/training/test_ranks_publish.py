"""How rank 0 publishes its rendezvous (``ranks.publish_rendezvous``, behind ``rendezvous_from``):
through a worker's own ``spawn`` control where there is one (so the node names the actor for the
other ranks' processes), under the same actor again for a run started again in that process, and
never over an actor of another kind."""

from __future__ import annotations

from typing import Any

import pytest

from troupe.actors.training.ranks import RENDEZVOUS_CLASS, RendezvousActor, rendezvous_from
from troupe.runtime import Actor, handles
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.transports.base import MemoryHub


class _Other(Actor):
    @handles("ping")
    def ping(self, _: Any) -> str:
        return "pong"


async def test_rank_0_publishes_through_the_workers_spawn_control() -> None:
    specs: list[dict[str, Any]] = []
    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:

        async def spawn(spec: dict[str, Any]) -> str:  # what a node's worker answers, minus the node
            specs.append(spec)
            await runtime.spawn(spec["class"], spec["name"], kwargs=spec["kwargs"])
            return spec["name"]

        runtime.register_control("spawn", spawn)
        rdv = await rendezvous_from(runtime, "rdv-spawned", 0, 2)
        peer = await rendezvous_from(runtime, "rdv-spawned", 1, 2, timeout_s=60, poll_s=0.01)
    where = {"addr": "127.0.0.1", "port": rdv.port, "world_size": 2}
    assert specs == [{"name": "rdv-spawned", "class": RENDEZVOUS_CLASS, "kwargs": where}]
    assert (peer.addr, peer.port, peer.rank, peer.world_size) == ("127.0.0.1", rdv.port, 1, 2)


async def test_a_run_started_again_in_the_same_process_publishes_its_new_port() -> None:
    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:
        first = await rendezvous_from(runtime, "rdv-again", 0, 2)
        actor = runtime.cells["rdv-again"].actor
        assert isinstance(actor, RendezvousActor)
        assert actor.where == {"addr": "127.0.0.1", "port": first.port, "world_size": 2}
        second = await rendezvous_from(runtime, "rdv-again", 0, 3)  # a world of 3 this time
        peer = await rendezvous_from(runtime, "rdv-again", 2, 3, timeout_s=60, poll_s=0.01)
        assert runtime.cells["rdv-again"].actor is actor  # the same actor answers the new address
    assert (peer.port, peer.world_size) == (second.port, 3)


async def test_a_name_taken_by_another_actor_is_refused() -> None:
    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:
        await runtime.spawn(_Other(), "rdv-taken")
        with pytest.raises(ValueError, match="'rdv-taken' is taken by a _Other"):
            await rendezvous_from(runtime, "rdv-taken", 0, 2)
