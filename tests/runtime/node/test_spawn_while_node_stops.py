"""A replica still starting when its node is stopped (SIGTERM, `ctl` shutdown) is answered
"node is stopping", which a run tries elsewhere: the node killed the starting worker and
answered that it exited while starting (killed by SIGTERM), a config error that ended the run
at once. Real node and worker in this process, on loopback; the worker's constructor waits."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from support.local_node import running_node
from troupe.runtime.errors import ActorStopped
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.testing.plugin import free_endpoint, import_path

pytestmark = pytest.mark.anyio

BOUND_S = 60.0  # against a hang only
TESTS = Path(__file__).resolve().parents[2]


async def test_a_worker_the_node_s_stop_ends_as_it_starts_is_answered_node_stopping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path(TESTS))  # the worker imports the tests' stage
    cfg = NodeConfig(name="stops", endpoint=free_endpoint(), log_dir=tmp_path, log_level="warning")
    slow = {"name": "stage", "class": "support.hook_stages:SlowStartStage", "kwargs": {"wait_s": 600}}
    answered: list[BaseException] = []
    with anyio.fail_after(BOUND_S):
        async with running_node(cfg) as node:

            async def spawn() -> None:
                try:
                    await node._spawn_worker({"name": "rep-0", "actors": [slow], "timeout_s": 600})
                except Exception as exc:  # what the run is answered
                    answered.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(spawn)
                while node.workers.get("rep-0") is None or node.workers["rep-0"].process is None:
                    await anyio.sleep(0.01)  # a bounded poll of in-process state
                node.stopping.set()
    (error,) = answered
    assert isinstance(error, ActorStopped) and "is stopping" in str(error), repr(error)
