"""A training run's spawns and stops of its workers name the run's process (``owner_process``),
as a pipeline run's do: the ranks have the same names in every run (``w-train-rank-0``...), and
a late stop of an earlier run must not stop a rerun's rank of the name (the node's side:
tests/runtime/node/test_stop_owner.py). On a master's cluster, whose nodes outlive the run, the
spawns also name the run their owner, so that a node stops the ranks of a run that was killed.
Without processes: fake nodes and ranks (support/fake_training.py).
"""

from __future__ import annotations

from pathlib import Path

import anyio

from support.fake_training import FakeTrainCluster, two_rank_driver
from support.recording_node import RecordingNode
from troupe.actors.training.train_driver import TrainDriver
from troupe.runtime.process_identity import process_identity

HANG_GUARD_S = 60  # a bound on a hang, never on speed
N0, N1 = "tcp://127.0.0.1:1", "tcp://10.0.0.2:7470"  # a node on the run's host, one on another


async def _train(driver: TrainDriver) -> None:
    with anyio.fail_after(HANG_GUARD_S):
        result = await driver.main(fresh=False)
    assert result.restarts == 1 and result.steps == 1


async def test_a_run_s_spawns_and_stops_of_its_ranks_name_its_process(tmp_path: Path) -> None:
    nodes = {N0: RecordingNode(), N1: RecordingNode()}
    await _train(two_rank_driver(FakeTrainCluster(nodes), tmp_path))
    for endpoint, node in nodes.items():
        assert len(node.spawns) == 2 and len(node.stops) == 1, (endpoint, node.spawns, node.stops)
        asked = [*node.spawns, *node.stops]
        assert all(a["owner_process"] == process_identity() for a in asked), asked
        assert all("owner" not in s for s in node.spawns)  # a node started here stops with the run
    assert nodes[N0].stopped == ["w-train-rank-0"] and nodes[N1].stopped == ["w-train-rank-1"]


async def test_on_a_cluster_the_ranks_name_the_run_their_owner(tmp_path: Path) -> None:
    nodes = {N0: RecordingNode(), N1: RecordingNode()}
    cluster = FakeTrainCluster(nodes)
    await _train(two_rank_driver(cluster, tmp_path, master="tcp://127.0.0.1:2"))
    # The node on the run's host pings the run; the other cannot, and asks the master it beats to.
    assert {s["owner"] for s in nodes[N0].spawns} == {cluster.address}
    tokens = {s["owner"] for s in nodes[N1].spawns}
    assert len(tokens) == 1 and tokens == {b["owner"] for b in cluster.beats}, (tokens, cluster.beats)
    assert all(s["owner_process"] == process_identity() for n in nodes.values() for s in n.spawns)
