"""A ``stop_worker`` that names its sender's process (``owner_process``) stops only a worker
started for that process. A pipeline's replicas have the same names in every run: a run's stop
that reached the node late (sent again after the run had stopped) stopped the replica of the
same name its rerun had started meanwhile. A stop without the field (an older run, an operator)
stops the worker of the name, as before. Real node and workers in this process, on loopback.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.local_node import ECHO, running_node
from troupe.runtime.errors import ActorStopped, UnknownActor
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.node.node import Node
from troupe.runtime.testing.plugin import free_endpoint

pytestmark = pytest.mark.anyio

WAIT_S = 60  # a bound on a hang, never on speed
# Two runs' processes. Of another pid space than this one: the node cannot judge them gone,
# so neither run's worker is taken for an orphan; only the stop's owner decides.
EARLIER = "boot-a:4026531836:4100:90001"
RERUN = "boot-a:4026531836:4200:90002"
NAME = "nav-render-1"


def _node(tmp_path: Path) -> AbstractAsyncContextManager[Node]:
    cfg = NodeConfig(
        name="own", endpoint=free_endpoint(), log_dir=tmp_path, log_level="warning", stop_grace_s=5.0
    )
    return running_node(cfg)


async def _spawn(node: Node, owner_process: str, owner: str | None = None) -> None:
    assert node.runtime is not None
    spec: dict[str, Any] = {
        "name": NAME,
        "actors": [ECHO.model_dump(by_alias=True)],
        "owner": owner or node.runtime.address,  # the node itself answers: a live run
        "owner_process": owner_process,
    }
    with anyio.fail_after(WAIT_S):
        await node._spawn_worker(spec)


async def _stop(node: Node, payload: dict[str, Any]) -> bool:
    with anyio.fail_after(WAIT_S):
        return await node._stop_worker(payload)


def _running(node: Node) -> bool:
    return node.workers[NAME].describe()["state"] == "running"


async def test_a_late_stop_of_an_earlier_run_leaves_its_rerun_s_replica_running(tmp_path: Path) -> None:
    async with _node(tmp_path) as node:
        await _spawn(node, EARLIER)
        assert await _stop(node, {"name": NAME, "owner_process": EARLIER}) is True
        await _spawn(node, RERUN)  # the rerun's replica takes the name
        with pytest.raises(UnknownActor, match="started for another process") as refused:
            await _stop(node, {"name": NAME, "owner_process": EARLIER})  # the earlier run's, late
        assert RERUN in str(refused.value) and EARLIER in str(refused.value)
        assert _running(node) and node.workers[NAME].returncode is None
        assert await _stop(node, {"name": NAME, "owner_process": RERUN}) is True  # its own run's
        assert node.workers[NAME].returncode is not None


async def test_a_stop_that_names_no_process_stops_the_worker_of_the_name(tmp_path: Path) -> None:
    async with _node(tmp_path) as node:
        await _spawn(node, RERUN)
        assert await _stop(node, {"name": NAME}) is True  # an older run's stop, or an operator's
        assert node.workers[NAME].returncode is not None


async def test_a_late_stop_does_not_cancel_the_rerun_s_start_waiting_for_the_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rerun's start waits for the name while the node asks whether the earlier run lives:
    the earlier run's late stop stops that run's replica, and the rerun's start goes on."""
    async with _node(tmp_path) as node:
        assert node.runtime is not None
        await _spawn(node, EARLIER, owner=free_endpoint())
        asked, verdict = anyio.Event(), anyio.Event()

        async def held_verdict(owner: str, process: str = "") -> bool:
            asked.set()
            await verdict.wait()
            return False  # it lives: its replica keeps the name, unless stopped meanwhile

        monkeypatch.setattr(node.owners, "gone", held_verdict)
        answers: list[Any] = []

        async def rerun_spawn() -> None:
            try:
                await _spawn(node, RERUN)
                answers.append("started")
            except ActorStopped as exc:
                answers.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(rerun_spawn)
            with anyio.fail_after(WAIT_S):
                await asked.wait()
            assert await _stop(node, {"name": NAME, "owner_process": EARLIER}) is True
            verdict.set()
        assert answers == ["started"]
        assert _running(node) and node.workers[NAME].owner_process == RERUN
