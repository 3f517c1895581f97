"""A training run on a master's cluster starts an encoder actor again on a live node when the
encoder's node dies while the ranks train: the other encoders used to carry its share until the
ranks restarted (which a lost encoder never causes) or the run ended. Without processes: fake
nodes (support/fake_training.py); the dead node answers no ping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from support.fake_training import FakeTrainCluster, train_driver
from support.recording_node import DeadNode, RecordingNode

HANG_GUARD_S = 120  # a bound on a hang, never on speed
LIVE, DEAD, MASTER = "tcp://127.0.0.1:1", "tcp://127.0.0.1:3", "tcp://127.0.0.1:5"


class _RankUntil:
    """A rank that trains (``running``) until ``done()`` says so, then is done."""

    def __init__(self, done: Any) -> None:
        self.done = done

    async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
        if msg_type != "progress":
            return {}
        if not self.done():
            return {"state": "running", "step": 0, "steps": 1}
        return {"state": "done", "step": 1, "steps": 1, "result": {"losses": [0.5]}}


class _Cluster(FakeTrainCluster):
    def __init__(self, nodes: dict[str, RecordingNode], alive: set[str], done: Any) -> None:
        super().__init__(nodes, alive)
        self.rank = _RankUntil(done)

    def ref(self, path: str) -> Any:
        return self.rank


@pytest.mark.parametrize("master_knows", [True, False], ids=["declared-dead", "still-listed"])
async def test_an_encoder_whose_node_dies_starts_again_on_a_live_node(
    tmp_path: Path, master_knows: bool
) -> None:
    live, dead = RecordingNode(), DeadNode()

    def replaced() -> bool:
        return "w-train-encode-1" in [s["name"] for s in live.spawns]

    cluster = _Cluster({LIVE: live, DEAD: dead}, {LIVE} if master_knows else {LIVE, DEAD}, replaced)
    driver = train_driver(cluster, tmp_path, MASTER, ranks=1, encoders=2, max_restarts=0)
    said: list[str] = []
    driver.say = said.append
    with anyio.fail_after(HANG_GUARD_S):
        result = await driver.main(False)
    assert [s["name"] for s in dead.spawns] == ["w-train-encode-1"]
    assert [s["name"] for s in live.spawns] == ["w-train-encode-0", "w-train-rank-0", "w-train-encode-1"]
    assert result.placement["train-encode-1"] == "n0" and result.restarts == 0
    assert any("w-train-encode-1: node n1 is gone; it starts again on n0" in line for line in said), said
    assert "w-train-encode-1" not in dead.stopped  # its node took it: no stop sent there


async def test_an_encoder_no_live_node_fits_is_said_once_and_the_run_goes_on(tmp_path: Path) -> None:
    """The only GPU node died: the encoder that needs a GPU has nowhere to go."""
    live, dead = RecordingNode(), DeadNode()
    cluster = _Cluster({LIVE: live, DEAD: dead}, {LIVE}, lambda: len(dead.pings) >= 6)  # 3 rounds
    driver = train_driver(
        cluster, tmp_path, MASTER, ranks=1, encoders=1, max_restarts=0, encoder_gpus=1, host_gpus=(0, 1)
    )
    said: list[str] = []
    driver.say = said.append
    with anyio.fail_after(HANG_GUARD_S):
        result = await driver.main(False)
    assert result.steps == 1 and result.placement["train-encode-0"] == "n1"
    told = [line for line in said if "not started elsewhere" in line]
    assert len(told) == 1 and "the encoders of node(s) n1, gone" in told[0], said
    assert "no node" in told[0] or "gpus" in told[0], told
    assert [s["name"] for s in live.spawns] == ["w-train-rank-0"]
