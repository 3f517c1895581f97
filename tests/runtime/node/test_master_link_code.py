"""A node's beat says the troupe code it runs (``code``), so the master can show which node runs
what and a run can tell a mixed cluster."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from troupe.runtime.code_identity import code_identity
from troupe.runtime.node.master_link import MasterLink

pytestmark = pytest.mark.anyio


class _Runtime:
    """Takes the link's hooks and answers its beats, keeping what they said."""

    address = "tcp://127.0.0.1:7470"

    def __init__(self) -> None:
        self.beats: list[dict[str, Any]] = []
        self.beaten = anyio.Event()

    def register_controls(self, handlers: dict[str, Any]) -> None:
        pass

    async def control(self, endpoint: str, msg_type: str, payload: Any = None, **_: Any) -> Any:
        if msg_type == "node_beat":
            self.beats.append(payload)
            self.beaten.set()
        return {"ok": True}


async def test_every_beat_says_the_code_the_node_runs() -> None:
    runtime = _Runtime()
    node = SimpleNamespace(
        name="n1",
        runtime=runtime,
        config=SimpleNamespace(advertise=None, tags=()),
        workers={},
        drained=set(),
        worker_exit_listeners=[],
    )
    link = MasterLink(node, "tcp://127.0.0.1:7480", beat_s=60.0)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(link.run)
        with anyio.fail_after(30):
            await runtime.beaten.wait()
        tg.cancel_scope.cancel()
    assert runtime.beats[0]["code"] == code_identity()
