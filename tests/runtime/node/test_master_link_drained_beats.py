"""A drained node's beats say so, and which undrain it took last: a master that restarted
learns the drain from them, and one that undrained the node tells a beat from before by it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from troupe.runtime.node.master_link import MasterLink

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
