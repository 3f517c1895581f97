"""A run whose replica ran on a node that died (the master still listing it) ends once the node
does not answer a ping, or once the master has it as dead: the stop sent to it is given up, and
said, not waited for to its deadline (30 s). Without processes: a fake node that answers no stop.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from support.log_capture import module_logs
from support.recording_node import NODE, DeadNode, one_stage_engine
from troupe.runtime.pipeline import replicas as replicas_module
from troupe.runtime.pipeline.engine import PipelineResult
from troupe.runtime.pipeline.hosts import EngineHosts
from troupe.runtime.placement import Host
from troupe.runtime.worker_stop import STOP_S

HANG_GUARD_S = 120  # a bound on a hang (past the stop's own deadline), never on speed


async def _run(node: DeadNode, hosts: EngineHosts | None = None) -> PipelineResult:
    with anyio.fail_after(HANG_GUARD_S):
        return await one_stage_engine(node, hosts).run()


def _given_up(logs: list[Any]) -> list[Any]:
    return [e for e in logs if e["event"] == "replica_stop_given_up"]


async def test_a_run_ends_without_waiting_for_a_node_that_does_not_answer_a_ping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = DeadNode()
    with module_logs(monkeypatch, replicas_module) as logs:
        result = await _run(node)
    assert result.counts()["ok"] == 4
    assert node.abandoned == ["p-a-0"] and node.timed_out == []
    assert node.pings and all(t is not None and t < STOP_S for t in node.pings)  # a short ask
    given_up = _given_up(logs)
    assert len(given_up) == 1 and given_up[0]["replica"] == "p-a-0", logs
    assert "does not answer a ping" in given_up[0]["why"]


@pytest.mark.parametrize("how", ["dead", "stopped"])
async def test_a_stop_is_given_up_once_the_master_has_its_node_as_dead_or_stopped(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Said as the master has the node: one that stopped (node_left) was called dead (mt 4)."""
    node = DeadNode(answers_pings=True)  # it answers pings, but not the stop: the master decides
    hosts = EngineHosts([Host.anything("n1", NODE)])
    result: list[PipelineResult] = []

    async def run() -> None:
        result.append(await _run(node, hosts))

    with module_logs(monkeypatch, replicas_module) as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.fail_after(HANG_GUARD_S):
                await node.stop_asked.wait()
            # The master's next look, as ``EngineHosts.watch`` takes it: the node is dead (or stopped).
            hosts._gone_as = {"n1": how}
            changed, hosts.hosts, hosts.changed = hosts.changed, [], anyio.Event()
            changed.set()
    assert result and result[0].counts()["ok"] == 4
    assert node.abandoned == ["p-a-0"] and node.timed_out == []
    given_up = _given_up(logs)
    assert len(given_up) == 1 and given_up[0]["why"] == f"the master has node n1 as {how}", logs
