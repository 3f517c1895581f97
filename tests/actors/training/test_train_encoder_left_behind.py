"""A training run on a master's cluster stops the encoder it moved off a node whose link was cut,
once that node answers again: the node had kept it running through the cut and rejoined with it,
two workers of one name beside the replacement, until the run ended (dt 6). The stop goes to that
node alone, never to the replacement's. Without processes: fake nodes (support/fake_training.py),
the cut node silent to pings while cut."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.fake_training import FakeTrainCluster, train_driver
from support.recording_node import RecordingNode
from troupe.actors.training import train_run
from troupe.actors.training.train_driver import TrainDriver
from troupe.actors.training.train_result import TrainingFailed
from troupe.runtime.errors import AskTimeout
from troupe.runtime.placement import Host

HANG_GUARD_S = 120  # a bound on a hang, never on speed
LIVE, CUT, MASTER = "tcp://127.0.0.1:1", "tcp://127.0.0.1:3", "tcp://127.0.0.1:5"
ENCODER = "w-train-encode-1"  # placed on CUT's node, n1
ROUNDS = 3  # the encoders' watch rounds after the mend that a run without the stop waits


class _CutNode(RecordingNode):
    """A node whose link is cut once it started its worker (pings go unanswered; it keeps its
    worker), until ``mend()``."""

    def __init__(self) -> None:
        super().__init__()
        self.cut = False

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        reply = await super().control(endpoint, kind, payload, timeout)
        if kind == "spawn_worker":
            self.cut = True
        return reply

    async def ping(self, timeout: float | None) -> None:
        if self.cut:
            raise AskTimeout(f"ask 'ping' to {CUT}: no reply within {timeout} s")

    def mend(self) -> None:
        self.cut = False


class _LiveNode(RecordingNode):
    """The live node: calls ``on_replacement`` once it started the moved encoder."""

    def __init__(self, on_replacement: Callable[[], None]) -> None:
        super().__init__()
        self.on_replacement = on_replacement

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        reply = await super().control(endpoint, kind, payload, timeout)
        if kind == "spawn_worker" and payload["name"] == ENCODER:
            self.on_replacement()
        return reply


class _RankUntil:
    """A rank that trains (``running``) until ``done()`` says so, then is done."""

    def __init__(self, done: Callable[[], bool]) -> None:
        self.done = done

    async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
        if msg_type != "progress":
            return {}
        if not self.done():
            return {"state": "running", "step": 0, "steps": 1}
        return {"state": "done", "step": 1, "steps": 1, "result": {"losses": [0.5]}}


class _Cluster(FakeTrainCluster):
    def __init__(self, nodes: dict[str, RecordingNode], done: Callable[[], bool]) -> None:
        super().__init__(nodes)
        self.rank = _RankUntil(done)

    def ref(self, path: str) -> Any:
        return self.rank


async def test_the_encoder_left_on_a_node_that_answers_again_is_stopped_there_alone(tmp_path: Path) -> None:
    cut = _CutNode()
    mended_at: list[int] = []  # the live node's pings when the cut was mended

    def mend() -> None:  # the link comes back once the run started the encoder elsewhere
        mended_at.append(len(live.pings))
        cut.mend()

    said: list[str] = []

    def done() -> bool:  # the stale encoder's stop said, or the rounds it had to come in passed
        stopped = any("answers again" in line for line in said)
        return stopped or (bool(mended_at) and len(live.pings) - mended_at[0] >= ROUNDS)

    live = _LiveNode(mend)
    cluster = _Cluster({LIVE: live, CUT: cut}, done)
    driver = train_driver(cluster, tmp_path, MASTER, ranks=1, encoders=2, max_restarts=0)
    driver.say = said.append
    with anyio.fail_after(HANG_GUARD_S):
        result = await driver.main(False)
    assert result.placement["train-encode-1"] == "n0" and result.restarts == 0
    assert [s["name"] for s in cut.stops] == [ENCODER], cut.stops  # once, on the node it was left on
    assert cut.stops[0]["owner_process"] == cut.spawns[0]["owner_process"]  # this run's, by its process
    assert live.stops == []  # the replacement is left alone
    assert any(f"{ENCODER}: node n1 answers again; the one left running there is stopped" in s for s in said)
    assert driver.to_stop == driver.spawned  # nothing left behind for the run's end


async def test_an_encoder_left_on_a_node_silent_to_the_end_is_in_what_the_end_stops(
    tmp_path: Path,
) -> None:
    """The run's end (``stop_remote``) stops it, where its node came back after the last round."""
    cut = _CutNode()
    moved_at: list[int] = []
    live = _LiveNode(lambda: moved_at.append(len(live.pings)))
    cluster = _Cluster({LIVE: live, CUT: cut}, lambda: bool(moved_at) and len(live.pings) - moved_at[0] >= 2)
    driver = train_driver(cluster, tmp_path, MASTER, ranks=1, encoders=2, max_restarts=0)
    with anyio.fail_after(HANG_GUARD_S):
        await driver.main(False)
    assert cut.stops == [] and live.stops == []
    assert [(w, h.name) for w, h in driver.to_stop if h.name == "n1"] == [(ENCODER, "n1")]
    assert [w for w, h in driver.to_stop if h.name == "n0"].count(ENCODER) == 1  # the replacement


class _OrderedNode(RecordingNode):
    """A live node that records its spawns and stops in the order asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, str]] = []

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind in ("spawn_worker", "stop_worker"):
            self.asked.append((kind, payload["name"]))
        return await super().control(endpoint, kind, payload, timeout)


async def test_an_encoder_moved_back_to_a_node_it_was_left_on_stops_that_one_first(tmp_path: Path) -> None:
    """Moved off n0, then off n1 back to n0 before a round found n0 answering (a restart's move):
    the node refuses a second worker of the name, so the one left there is stopped first."""
    back, other = _OrderedNode(), RecordingNode()
    cluster = _Cluster({LIVE: back, CUT: other}, lambda: True)
    driver = train_driver(cluster, tmp_path, MASTER, ranks=1, encoders=2, max_restarts=0)
    n0, n1 = Host.anything("n0", LIVE), Host.anything("n1", CUT)
    driver.encoders[1] = ("train-encode-1", ENCODER, n1)
    driver.left_behind.append((ENCODER, Host("n0", LIVE, draining=True)))  # as the master listed it then
    with anyio.fail_after(HANG_GUARD_S):
        await driver._move_encoders([n0])
    assert back.asked == [("stop_worker", ENCODER), ("spawn_worker", ENCODER)]
    assert [(w, h.name) for w, h in driver.left_behind] == [(ENCODER, "n1")]


async def test_the_run_end_stops_what_its_driver_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_training``'s end with ``--master`` (``stop_remote``) is given the encoders left behind
    as well as the workers spawned. Its folder, cluster and driver faked."""
    cluster = _Cluster({LIVE: RecordingNode()}, lambda: True)
    cfg = train_driver(cluster, tmp_path, None, ranks=1, encoders=0, max_restarts=0).cfg
    left = (ENCODER, Host.anything("n1", CUT))

    class LeftOne(TrainDriver):
        async def main(self, fresh: bool) -> Any:
            self.spawned.append(("w-train-rank-0", Host.anything("n0", LIVE)))
            self.left_behind.append(left)
            raise TrainingFailed("training failed: the rest of this run is not under test")

    class Held:
        def release(self) -> None:
            pass

    @contextlib.asynccontextmanager
    async def cluster_here(*_: Any) -> AsyncIterator[tuple[Any, list[Host]]]:
        yield cluster, [Host.anything("n0", LIVE)]

    stopped: list[list[tuple[str, Host]]] = []

    async def stop_remote_here(master: str, workers: list[tuple[str, Host]], keys: Any) -> None:
        stopped.append(list(workers))

    async def master_checked(*_: Any) -> None:
        pass

    (tmp_path / "logs").mkdir()
    monkeypatch.setattr(train_run, "prepare_run", lambda *_: (cfg, tmp_path, Held(), []))
    monkeypatch.setattr(train_run, "training_cluster", cluster_here)
    monkeypatch.setattr(train_run, "check_master", master_checked)
    monkeypatch.setattr(train_run, "stop_remote", stop_remote_here)
    monkeypatch.setattr(train_run, "TrainDriver", LeftOne)
    with anyio.fail_after(HANG_GUARD_S), pytest.raises(TrainingFailed):
        await train_run.run_training("faked", tmp_path, master=MASTER)
    assert [[(w, h.name) for w, h in workers] for workers in stopped] == [
        [("w-train-rank-0", "n0"), (ENCODER, "n1")]
    ]
