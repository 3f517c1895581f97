"""A node answers ``spawn_worker`` once the master's directory knows the worker, and a worker's
``spawn`` of an actor once the master knows the actor.

A run's engine tells every replica pulling from a replica that holds outputs where that holder
listens, at once; a replica on a node of an older troupe ignores that and asks the master. The
master learned of a new worker from its node's next beat only, up to a second later: it
answered ``unknown_actor``, and the engine took a healthy replica for lost (a mixed-version
cluster lost episodes). Real master and node in this process, on loopback; the link's own beats
an hour apart, so that only a beat the spawn itself makes can tell the master.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from support.local_node import ECHO, running_node
from troupe.runtime.node import node as node_module
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.node.master_link import MasterLink
from troupe.runtime.node.node import Node
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.testing.plugin import free_endpoint

pytestmark = pytest.mark.anyio

WAIT_S = 60  # a bound on a worker's start on a loaded machine, not on speed
HOUR_S = 3600.0


@asynccontextmanager
async def master_and_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Master, Node]]:
    """A master and a node of it in this process, the link's own beats an hour apart."""
    monkeypatch.setattr(node_module, "MasterLink", functools.partial(MasterLink, beat_s=HOUR_S))
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    # Silent an hour between beats, the node stays alive for the master meanwhile.
    master = Master(MasterConfig(endpoint=free_endpoint(), node_timeout_s=HOUR_S), journal, book)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(master.run)
            with anyio.fail_after(WAIT_S):
                await master.ready.wait()
            cfg = NodeConfig(
                name="nnew", endpoint=free_endpoint(), log_dir=tmp_path, log_level="warning",
                stop_grace_s=5.0, master=master.config.endpoint,
            )  # fmt: skip
            async with running_node(cfg) as node:
                yield master, node
            master.stop()
    finally:
        journal.close()


async def _spawned(node: Node) -> dict[str, object]:
    assert node.runtime is not None
    spec = {"name": "tg2-render-4", "actors": [ECHO.model_dump(by_alias=True)], "timeout_s": 50.0}
    return await node.runtime.control(node.runtime.address, "spawn_worker", spec, timeout=WAIT_S)


async def _resolved(node: Node, master: Master, actor: str = "echo") -> object:
    assert node.runtime is not None
    address = f"nnew/tg2-render-4/{actor}"
    reply = await node.runtime.control(master.config.endpoint, "resolve", {"address": address})
    return reply["endpoint"]


async def test_the_master_names_a_spawned_worker_once_its_spawn_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with master_and_node(tmp_path, monkeypatch) as (master, node):
        record = await _spawned(node)
        assert await _resolved(node, master) == record["actor_endpoints"]["echo"]  # type: ignore[index]


async def test_the_master_names_an_actor_spawned_in_a_worker_once_the_spawn_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An actor a running worker starts on request (its ``spawn`` control): the master knew of
    it from the node's next beat only (here an hour away)."""
    async with master_and_node(tmp_path, monkeypatch) as (master, node):
        record = await _spawned(node)
        assert node.runtime is not None
        actor = {"name": "echo2", "class": ECHO.cls}
        await node.runtime.control(str(record["endpoint"]), "spawn", actor, timeout=WAIT_S)
        assert await _resolved(node, master, "echo2") == node.workers["tg2-render-4"].actors["echo2"]
