"""A long-lived node forgets the oldest records of workers it spawned on request and stopped.

Each pipeline run spawns its replicas on the node anew (``spawn_worker``) and stops them when it
ends; a node serving run after run would otherwise list every replica it ever ran in its status
(``troupe ctl status``), without end. Real node and workers in this process, on loopback; the
bound is lowered to 2 so that the test spawns few workers.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio
import pytest

from support.local_node import running_node
from troupe.runtime.node import spawn_controls
from troupe.runtime.node.config import ActorSpec, NodeConfig, WorkerSpec
from troupe.runtime.node.node import Node
from troupe.runtime.testing.plugin import free_endpoint

pytestmark = pytest.mark.anyio

ECHO = ActorSpec(name="echo", cls="troupe.actors.demo.actors:Echo")


def _node(tmp_path: Path) -> AbstractAsyncContextManager[Node]:
    cfg = NodeConfig(
        name="rec",
        endpoint=free_endpoint(),
        log_dir=tmp_path,
        log_level="warning",
        stop_grace_s=5.0,
        workers=(WorkerSpec(name="configured", actors=(ECHO,)),),
    )
    return running_node(cfg)


async def _spawn_and_stop(node: Node, name: str) -> None:
    with anyio.fail_after(60):
        await node._spawn_worker({"name": name, "actors": [ECHO.model_dump(by_alias=True)]})
        await node._stop_worker({"name": name})


async def test_only_the_latest_stopped_spawned_workers_stay_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spawn_controls, "KEEP_STOPPED_SPAWNED", 2)
    async with _node(tmp_path) as node:
        await node._stop_worker({"name": "configured"})
        for name in ("run1-a", "run1-b", "run2-a", "run2-b"):
            await _spawn_and_stop(node, name)
        # The newest spawn keeps one record fewer than the bound: with itself, the bound holds.
        assert set(node.workers) == {"configured", "run2-a", "run2-b"}
        with anyio.fail_after(60):
            await node._spawn_worker({"name": "run3-a", "actors": [ECHO.model_dump(by_alias=True)]})
        assert set(node.workers) == {"configured", "run2-b", "run3-a"}
        assert node.workers["run3-a"].describe()["state"] == "running"  # a live one is never forgotten
        status = await node._status(None)
        assert {w["name"] for w in status["workers"]} == {"configured", "run2-b", "run3-a"}


async def test_a_drained_spawned_worker_keeps_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An undrain starts again what the drain stopped, from its record: it must still be there."""
    monkeypatch.setattr(spawn_controls, "KEEP_STOPPED_SPAWNED", 1)
    async with _node(tmp_path) as node:
        await _spawn_and_stop(node, "drained")
        node.drained.add("drained")
        for name in ("later-a", "later-b"):
            await _spawn_and_stop(node, name)
        assert "drained" in node.workers and "later-a" not in node.workers


async def test_a_stopped_spawned_worker_s_connections_are_closed(tmp_path: Path) -> None:
    """Each connection the node made to a replica (its status asks, its directory updates)
    holds three file descriptors, and a replica's endpoint is never used again once it stopped:
    a node serving run after run, each with replicas of new names, ran out of descriptors."""
    async with _node(tmp_path) as node:
        runtime = node.runtime
        assert runtime is not None
        with anyio.fail_after(60):  # the node's own connections first: its supervisor's among them
            while not (await runtime.control(runtime.address, "status", timeout=30))["supervision"].get(
                "supervisor_endpoint"
            ):
                await anyio.sleep(0.05)
        await _spawn_and_stop(node, "warm-up")  # the node tells the supervisor of it
        with anyio.fail_after(60):
            await runtime.control(runtime.address, "status", timeout=30)
        before = runtime.transport.statistics().peers
        for i in range(3):
            with anyio.fail_after(60):
                await node._spawn_worker({"name": f"rep-{i}", "actors": [ECHO.model_dump(by_alias=True)]})
                await runtime.control(runtime.address, "status", timeout=30)  # it asks each worker
            assert runtime.transport.statistics().peers > before
            with anyio.fail_after(60):
                await node._stop_worker({"name": f"rep-{i}"})
        assert runtime.transport.statistics().peers == before
