"""With two ranks, a rank whose worker died (SIGKILL) is the reason a restart gives, not its
peer's error: the peer fails at once in their collective (gloo's ``Connection reset by peer``),
while the dead rank answers nothing until its node has started its worker again. The driver
named rank 0's gloo error. Without processes: fake nodes and ranks (support/fake_training.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from support.fake_training import train_driver
from support.log_capture import module_logs
from support.recording_node import RecordingNode
from troupe.actors.training import train_driver as driver_module
from troupe.actors.training.train_driver import restart_line
from troupe.runtime.errors import PeerLost

HANG_GUARD_S = 60  # a bound on a hang, never on speed
N0, N1 = "tcp://127.0.0.1:1", "tcp://127.0.0.1:3"
GLOO = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"


class KilledWorkerNode(RecordingNode):
    """Rank 1's node: its worker was killed, and the node says so."""

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "supervision":
            return {"workers": [{"name": "w-train-rank-1", "exit": "killed by SIGKILL"}]}
        return await super().control(endpoint, kind, payload, timeout)


class PeerKilledCluster:
    """The first attempt: rank 0 fails with gloo's error at once; rank 1 answers nothing twice
    (its worker is dead), then ``idle`` (its node started it again). The next attempt: done."""

    address = "tcp://127.0.0.1:9"

    def __init__(self) -> None:
        self.nodes = {N0: RecordingNode(), N1: KilledWorkerNode()}
        self.attempts = 0
        self.rank1_asks = 0

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        return await self.nodes[endpoint].control(endpoint, kind, payload, timeout)

    def ref(self, actor: str) -> Any:
        return _Rank(self, actor)


class _Rank:
    def __init__(self, cluster: PeerKilledCluster, actor: str) -> None:
        self.cluster, self.actor = cluster, actor

    async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
        cluster = self.cluster
        if msg_type == "start":
            cluster.attempts += self.actor == "train-rank-0"
            return {"started": True, "resumed_from": None}
        if cluster.attempts > 1:
            return {"state": "done", "step": 1, "steps": 1, "result": {"losses": [0.5]}}
        if self.actor == "train-rank-0":
            return {"state": "failed", "error": GLOO}
        cluster.rank1_asks += 1
        if cluster.rank1_asks <= 2:
            raise PeerLost("the connection to rank 1's worker ended")
        return {"state": "idle"}


async def test_the_rank_whose_worker_died_is_named_not_its_peers_gloo_error(tmp_path: Path) -> None:
    cluster = PeerKilledCluster()
    said: list[str] = []
    driver = train_driver(cluster, tmp_path, None, ranks=2, encoders=0, max_restarts=3)
    driver.say = said.append
    with anyio.fail_after(HANG_GUARD_S):
        result = await driver.main(False)
    assert result.restarts == 1
    restarts = [line for line in said if "restarting every rank" in line]
    assert restarts == [
        "rank 1 lost its worker (killed by SIGKILL; restarted by its node); restarting every rank "
        "from the last checkpoint (1/3)"
    ], said


async def test_a_restart_s_line_and_its_event_say_one_reason_and_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tr 3: a restart is logged twice, with its figures (``train_restart``) and as the line the
    terminal says (``train_said``, logged by ``run_training``'s ``say``); one function words the
    line from the event's figures, so the two cannot drift apart."""
    said: list[str] = []
    driver = train_driver(PeerKilledCluster(), tmp_path, None, ranks=2, encoders=0, max_restarts=3)
    driver.say = said.append
    with module_logs(monkeypatch, driver_module) as logs, anyio.fail_after(HANG_GUARD_S):
        await driver.main(False)
    (event,) = [e for e in logs if e["event"] == "train_restart"]
    assert (event["log_level"], event["restart"], event["max_restarts"]) == ("warning", 1, 3)
    assert event["reason"].startswith("rank 1 lost its worker") and GLOO in event["errors"], event
    line = restart_line(restart=event["restart"], max_restarts=event["max_restarts"], reason=event["reason"])
    assert [s for s in said if "restarting every rank" in s] == [line]
