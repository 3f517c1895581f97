"""A drained node's beats say so, and which undrain it took last: a master that restarted
learns the drain from them, and one that undrained the node tells a beat from before by it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import anyio.abc
import pytest

from troupe.runtime.node.config import WorkerSpec
from troupe.runtime.node.master_link import MasterLink
from troupe.runtime.node.worker_handles import WorkerHandle

pytestmark = pytest.mark.anyio


class _Controls:
    """The node's runtime: keeps the beats sent and the control handlers the link registers
    (the master's messages to the node)."""

    address = "tcp://127.0.0.1:24470"

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}
        self.beats: list[dict[str, Any]] = []

    def register_controls(self, handlers: dict[str, Any]) -> None:
        self.handlers.update(handlers)

    async def control(self, endpoint: str, msg_type: str, payload: Any = None, **_: Any) -> Any:
        if msg_type == "node_beat":
            self.beats.append(payload)
        return True


async def test_beats_say_the_node_is_drained_and_which_undrain_it_took_last() -> None:
    runtime = _Controls()
    node = SimpleNamespace(
        name="n1",
        config=SimpleNamespace(advertise=None, tags=(), stop_grace_s=1.0),
        workers={},
        drained=set(),
        runtime=runtime,
        worker_exit_listeners=[],
    )
    link = MasterLink(node, "tcp://127.0.0.1:24480")  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(link.run)
        with anyio.fail_after(5):
            while not runtime.beats:
                await anyio.sleep(0.01)
        await runtime.handlers["master_drained"]({"node": "n1"})
        await link.beat_now()
        drained = runtime.beats[-1]
        await runtime.handlers["master_undrained"]({"node": "n1", "token": "t1"})
        await link.beat_now()
        undrained = runtime.beats[-1]
        tg.cancel_scope.cancel()
    assert (runtime.beats[0]["drained"], runtime.beats[0]["undrain_token"]) == (False, "")
    assert (drained["drained"], drained["undrain_token"]) == (True, "")
    assert (undrained["drained"], undrained["undrain_token"]) == (False, "t1")


async def test_an_undrained_worker_keeps_the_restarts_it_had_before_the_drain() -> None:
    """The undrain starts the drained worker through spawn_worker, which makes a fresh record of
    it: ctl status said 0 restarts after every undrain."""
    spec = WorkerSpec.model_validate({"name": "w-a", "kind": "cpu"})
    drained = WorkerHandle(spec)
    drained.restarts, drained.returncode = 3, 0
    started = anyio.Event()

    class _Spawns(_Controls):
        def __init__(self, tg: anyio.abc.TaskGroup) -> None:
            super().__init__()
            self.start_soon = tg.start_soon

        async def control(self, endpoint: str, msg_type: str, payload: Any = None, **_: Any) -> Any:
            if msg_type != "spawn_worker":
                return await super().control(endpoint, msg_type, payload)
            node.workers[payload["name"]] = WorkerHandle(spec)  # as the node's spawn_worker does
            started.set()
            return {}

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            runtime = _Spawns(tg)
            node = SimpleNamespace(
                name="n1",
                config=SimpleNamespace(advertise=None, tags=(), stop_grace_s=1.0),
                workers={"w-a": drained},
                drained={"w-a"},
                runtime=runtime,
                worker_exit_listeners=[],
            )
            link = MasterLink(node, "tcp://127.0.0.1:24480")  # type: ignore[arg-type]
            tg.start_soon(link.run)
            while "master_undrained" not in runtime.handlers:
                await anyio.sleep(0.01)
            assert await runtime.handlers["master_undrained"]({"node": "n1", "token": "t1"}) == ["w-a"]
            await started.wait()
            while node.workers["w-a"].restarts != 3:  # bounded by the fail_after above
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert node.workers["w-a"] is not drained
