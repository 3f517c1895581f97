"""A training run whose rank's node died (the master still listing it) does not wait for the
stop it sends that node when it restarts its ranks: the stop is given up, and said, once the
node does not answer a ping, not waited for to its deadline. Without processes: fake nodes
(support/fake_training.py), one of which answers no stop and no ping after its first spawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from support.fake_training import FakeTrainCluster, two_rank_driver
from support.log_capture import module_logs
from support.recording_node import DeadNode, RecordingNode
from troupe.actors.training import train_cluster
from troupe.runtime.worker_stop import STOP_S

HANG_GUARD_S = 120  # a bound on a hang (past the stop's own deadline), never on speed
LIVE, DEAD = "tcp://127.0.0.1:1", "tcp://127.0.0.1:3"


class DiesAfterItsFirstSpawn(DeadNode):
    """A node that started rank 1, then died: its stop and pings go unanswered, and so would a
    spawn, which is only recorded (the run is cancelled then)."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned_again = anyio.Event()

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "spawn_worker" and self.spawns:
            self.spawned_again.set()
            await anyio.sleep_forever()
        return await super().control(endpoint, kind, payload, timeout)


async def test_a_restart_does_not_wait_for_the_stop_of_a_node_that_does_not_answer_a_ping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = DiesAfterItsFirstSpawn()
    driver = two_rank_driver(FakeTrainCluster({LIVE: RecordingNode(), DEAD: dead}), tmp_path)
    with module_logs(monkeypatch, train_cluster) as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(driver.main, False)
            with anyio.fail_after(HANG_GUARD_S):
                await dead.spawned_again.wait()  # the restart went on past the stop
            tg.cancel_scope.cancel()
    assert dead.abandoned == ["w-train-rank-1"] and dead.timed_out == []
    assert dead.pings and all(t is not None and t < STOP_S for t in dead.pings)  # a short ask
    given_up = [e for e in logs if e["event"] == "train_worker_stop_given_up"]
    assert len(given_up) == 1 and given_up[0]["worker"] == "w-train-rank-1", logs
    assert "does not answer a ping" in given_up[0]["why"]
