"""The node's count of each worker's restarts outlives the worker's handle."""

from __future__ import annotations

from types import SimpleNamespace

import anyio

from troupe.runtime.node.config import NodeConfig, WorkerSpec
from troupe.runtime.node.worker_handles import HandleState, WorkerHandle
from troupe.runtime.supervision.node_side import NodeSupervision


def crashed(spec: WorkerSpec) -> WorkerHandle:
    handle = WorkerHandle(spec)
    handle.state = HandleState.RUNNING
    handle.exited(-9)  # reaped, not stopped on purpose: a restart is due
    return handle


async def test_restarts_go_on_from_the_count_when_the_node_replaces_the_handle() -> None:
    """An undrain starts a drained worker under a fresh handle (its own count 0): the node's
    count, which the metrics export, goes on from what it was."""
    spec = WorkerSpec(name="w", actors=[])
    node = SimpleNamespace(
        config=NodeConfig(name="n"), name="n", workers={}, worker_exit_listeners=[], stopping=anyio.Event()
    )
    supervision = NodeSupervision(node)  # type: ignore[arg-type]
    supervision.worker_exited(crashed(spec))
    fresh = crashed(spec)  # the undrain's start, which crashed in turn
    supervision.worker_exited(fresh)
    assert fresh.restarts == 1
    assert supervision.worker_restarts == {("w", "default"): 2}
