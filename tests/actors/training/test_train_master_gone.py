"""A training run on a master's cluster whose master is killed while the ranks train: the run
reaches its ranks through their nodes (the addresses the nodes gave as they spawned them), says
once that the master does not answer, and finishes when the ranks finish. It had resolved every
rank's name through the master: the progress bar froze, a live rank was taken for lost after two
minutes, and the restart failed on the master's ``resolve``, though the rank had finished.
Without processes: a fake node and a master that answers nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from support.fake_training import train_driver
from support.recording_node import RecordingNode
from troupe.actors.training.worker_addresses import WorkerAddresses
from troupe.runtime.core.directory import Directory
from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.errors import Unreachable
from troupe.runtime.placement import Host

HANG_GUARD_S = 60  # a bound on a hang, never on speed
NODE, MASTER = "tcp://127.0.0.1:1", "tcp://127.0.0.1:5"
RANK_AT = "tcp://127.0.0.1:7"  # where the node says the rank's actor listens


class SpawningNode(RecordingNode):
    """A node that answers a spawn with its name and the worker's actors' endpoints."""

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "spawn_worker":
            await super().control(endpoint, kind, payload, timeout)
            actor = payload["actors"][0]["name"]
            return {"node": "n0", "actor_endpoints": {actor: RANK_AT}}
        return await super().control(endpoint, kind, payload, timeout)


class MasterGoneCluster:
    """The run's runtime once the master died: nothing reaches it (its pings, beats, resolves),
    and a rank is reached only at the address its node gave. The rank trains until the run has
    said the master is gone, then is done."""

    address = "tcp://127.0.0.1:9"

    def __init__(self, node: SpawningNode) -> None:
        self.nodes = {NODE: node}
        self.directory = Directory("")
        self.master_said = anyio.Event()
        self.polls = 0

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if endpoint == MASTER:
            raise Unreachable(f"no reply to {kind!r} from {MASTER}: the master is gone")
        return await self.nodes[endpoint].control(endpoint, kind, payload, timeout)

    def ref(self, address: str) -> Any:
        return _Rank(self, address)


class _Rank:
    def __init__(self, cluster: MasterGoneCluster, address: str) -> None:
        self.cluster, self.address = cluster, address

    async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
        if "/" not in self.address:  # a bare name resolves through the master
            raise Unreachable(f"no reply to 'resolve' from {MASTER}: the master is gone")
        full, endpoint = await self.cluster.directory.resolve(ActorAddress.parse(self.address))
        assert endpoint == RANK_AT, (full, endpoint)
        if msg_type != "progress":
            return {"started": True, "resumed_from": None}
        self.cluster.polls += 1
        if not self.cluster.master_said.is_set():
            return {"state": "running", "step": 1, "steps": 2, "loss": 0.7}
        return {"state": "done", "step": 2, "steps": 2, "result": {"losses": [0.7, 0.5]}}


async def test_the_run_finishes_through_the_ranks_nodes_when_the_master_is_gone(tmp_path: Path) -> None:
    cluster = MasterGoneCluster(SpawningNode())
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if "does not answer" in line:
            cluster.master_said.set()

    driver = train_driver(cluster, tmp_path, MASTER, ranks=1, encoders=0, max_restarts=0)
    driver.say = say
    with anyio.fail_after(HANG_GUARD_S):
        result = await driver.main(False)
    assert result.steps == 2 and result.restarts == 0 and result.losses == [0.7, 0.5]
    silent = [line for line in said if "does not answer" in line]
    assert silent == [
        f"the master at {MASTER} does not answer; the ranks and encoders go on, reached through "
        "their nodes (a node lost now is not replaced)"
    ], said


@pytest.mark.parametrize("answers", [True, False], ids=["node-knows", "not-yet"])
async def test_a_rank_whose_ask_failed_is_resolved_again_at_its_node(answers: bool) -> None:
    """A worker its node restarted listens elsewhere: asked at its node, not at the master."""

    class Node:
        directory = Directory("")

        async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
            assert (endpoint, kind, payload) == (NODE, "resolve", {"address": "w-train-rank-0/train-rank-0"})
            if not answers:
                raise Unreachable("the worker is not running yet")
            return {"address": "n0/w-train-rank-0/train-rank-0", "endpoint": "tcp://127.0.0.1:8"}

    runtime = Node()
    addresses = WorkerAddresses(runtime)  # type: ignore[arg-type]
    addresses.learn("w-train-rank-0", {"node": "n0", "actor_endpoints": {"train-rank-0": RANK_AT}})
    assert runtime.directory.cached("n0/w-train-rank-0/train-rank-0") == RANK_AT
    await addresses.resolve_at_node("train-rank-0", "w-train-rank-0", Host.anything("n0", NODE, 0))
    assert addresses.of("train-rank-0") == "n0/w-train-rank-0/train-rank-0"
    # Resolved again where the node says; else the dead endpoint is forgotten, not asked again.
    expected = "tcp://127.0.0.1:8" if answers else None
    assert runtime.directory.cached("n0/w-train-rank-0/train-rank-0") == expected
