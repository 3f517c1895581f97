"""A worker that registered before the template's reply with its pid, while the supervisor was
still starting, ran unwatched for good: its registration sent no ``watch`` (no supervisor yet),
the supervisor's ``supervisor_ready`` re-watched only the workers already running (this one was
still "starting", its launch not yet recorded), and the launch sent none. A hang in it was never
killed, and a test's cluster waited out its readiness timeout ("'w2' running, not yet watched by
the supervisor"). The supervisor's ready now watches every worker that registered."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest

from troupe.runtime.node.config import NodeConfig, WorkerSpec
from troupe.runtime.node.worker_handles import HandleState, WorkerHandle
from troupe.runtime.supervision.node_side import NodeSupervision

SUPERVISOR = "tcp://127.0.0.1:5999"
WORKER = "tcp://127.0.0.1:5001"


@dataclass
class _Process:
    pid: int


class _Runtime:
    """The node's runtime, as far as supervision uses it: the control messages it sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    async def control(self, endpoint: str, msg_type: str, payload: Any, timeout: float) -> bool:
        self.sent.append((endpoint, msg_type, payload))
        return True


@pytest.fixture
def child() -> Iterator[int]:
    """A child of this process: the pid of the supervisor, and of the worker (the node's own)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.anyio
async def test_a_worker_registered_before_its_launch_and_the_supervisor_is_watched(child: int) -> None:
    runtime = _Runtime()
    handle = WorkerHandle(WorkerSpec(name="w", actors=[]))
    node = SimpleNamespace(config=NodeConfig(name="n"), name="n", workers={"w": handle}, runtime=runtime)
    supervision = NodeSupervision(node)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        supervision._tg = tg
        handle.registered(WORKER, child, {})  # forked: its register came before the template's reply
        supervision.worker_registered(handle)  # no supervisor yet: nothing to send a watch to
        ready = {"endpoint": SUPERVISOR, "udp": ["127.0.0.1", 5998], "pid": child}
        assert await supervision._supervisor_ready(ready) is True
        handle.launched(cast(Any, _Process(child)))  # the template's reply, read at last
        assert handle.state is HandleState.RUNNING
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()  # the restart tracker's wait for "healthy"
    watch = {"worker_id": "w", "pid": child, "kind": handle.spec.kind}
    assert (SUPERVISOR, "watch", watch) in runtime.sent, runtime.sent
