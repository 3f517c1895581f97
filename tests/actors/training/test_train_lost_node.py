"""A training run on a master's cluster whose rank's node died starts that rank again on a live
node: it had spawned it on the dead one again, waited out the spawn's deadline (two minutes) and
failed the run, restarts left or not. Without processes: fake nodes (support/fake_training.py)
and a fake master's status; the dead node answers no ping, and a second spawn there would hang."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from support.fake_training import FakeTrainCluster, two_rank_driver
from support.recording_node import DeadNode, RecordingNode

HANG_GUARD_S = 120  # a bound on a hang, never on speed
LIVE, DEAD, MASTER = "tcp://127.0.0.1:1", "tcp://127.0.0.1:3", "tcp://127.0.0.1:5"


class DiesAfterItsFirstSpawn(DeadNode):
    """Rank 1's node: it died after starting the rank; a spawn there now never answers."""

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "spawn_worker" and self.spawns:
            self.spawns.append(dict(payload))
            await anyio.sleep_forever()
        return await super().control(endpoint, kind, payload, timeout)


@pytest.mark.parametrize("master_knows", [True, False], ids=["declared-dead", "still-listed"])
async def test_a_rank_whose_node_is_gone_starts_again_on_a_live_node(
    tmp_path: Path, master_knows: bool
) -> None:
    """Declared dead by the master, or still listed (its node_timeout not over) but silent to a
    ping: either way the restart places the rank on the live node."""
    live, dead = RecordingNode(), DiesAfterItsFirstSpawn()
    cluster = FakeTrainCluster({LIVE: live, DEAD: dead}, {LIVE} if master_knows else {LIVE, DEAD})
    said: list[str] = []
    driver = two_rank_driver(cluster, tmp_path, master=MASTER)
    driver.say = said.append
    with anyio.fail_after(HANG_GUARD_S):
        result = await driver.main(False)
    assert result.restarts == 1
    assert [s["name"] for s in live.spawns] == ["w-train-rank-0", "w-train-rank-0", "w-train-rank-1"]
    assert [s["name"] for s in dead.spawns] == ["w-train-rank-1"]  # never asked there again
    assert driver.placement["train-rank-1"] == "n0"
    assert any("node n1 is gone; it starts again on n0" in line for line in said), said
