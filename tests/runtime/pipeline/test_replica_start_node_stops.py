"""A node stopped mid-run (``troupe ctl`` shutdown, SIGTERM) while the run starts a replica.
Without processes: a fake master and nodes, as the run's runtime sees them.

What a user relies on: the node said it stops ("node n1 is stopping; it starts no worker"), then
exited. The run tried it again (the only node that fit, or the one with fewest replicas once it
was no longer avoided) and its ``spawn_worker`` went to an endpoint nobody listens at any more
(no connection to lose, so no PeerLost): it waited out its whole deadline (130 s), saying every
30 s that the replica's imports were slow. A node that said it stops now gets no replica while
another fits, or the start waits as for a node gone (NoNodeNow); a spawn in flight ends once the
master has its node as dead, and a slow start on a node that does not answer says so.

The spawn's deadline is set far above the bound on each test: a run that waits for it fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from support.ok_replica import OkReplica
from troupe.runtime.errors import ActorStopped, AskTimeout, StageFailed
from troupe.runtime.pipeline import hosts as hosts_module
from troupe.runtime.pipeline import replicas as replicas_module
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine, PipelineResult
from troupe.runtime.pipeline.hosts import EngineHosts, NoNodeNow
from troupe.runtime.pipeline.source import LocalSource
from troupe.runtime.placement import Host

pytestmark = pytest.mark.anyio

WAIT_S = 20  # bound on each run: far below the spawn's deadline, never an upper bound on speed
MASTER = "tcp://master:1"


@pytest.fixture(autouse=True)
def short_pauses_long_deadlines(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(replicas_module, "_RETRY_FIRST_S", 0.001)
    monkeypatch.setattr(replicas_module, "_RETRY_MAX_S", 0.002)
    monkeypatch.setattr(replicas_module, "_START_S", 3600.0)  # a spawn nobody answers: an hour
    monkeypatch.setattr(replicas_module, "_SLOW_START_S", 3600.0)
    yield


class Cluster:
    """The run's view of a master and its nodes ``n1`` (which stops) and, if ``with_n2``, ``n2``.

    n1 answers its first ``spawn_worker`` ActorStopped if ``says_stopping``; every later one (or
    every one, if not) it never answers, nor anything else: its process exited. ``dead_after``
    (called with each such spawn) says whether the master has n1 as dead from then on. n2
    starts replicas at once, and each answers every item ok.
    """

    def __init__(
        self, with_n2: bool, says_stopping: bool = True, dead_after: Callable[[str], bool] | None = None
    ) -> None:
        self.names = ["n1", "n2"] if with_n2 else ["n1"]
        self.says_stopping = says_stopping
        self.dead_after = dead_after or (lambda replica: False)
        self.spawns: dict[str, list[str]] = {name: [] for name in self.names}
        self.stopped_at: float | None = None  # when n1 stopped (its last beat)
        self.n1_dead = False

    @property
    def hosts(self) -> list[Host]:
        return [Host(name, f"tcp://{name}:1") for name in self.names]

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float = 5.0) -> Any:
        if endpoint == MASTER:
            assert kind == "status", kind
            return {"master": "master", "nodes": [self._node(name) for name in self.names]}
        node = endpoint.removeprefix("tcp://").removesuffix(":1")
        if kind == "spawn_worker":
            self.spawns[node].append(payload["name"])
        if node == "n2":
            if kind == "supervision":
                return {"workers": [{"name": n, "state": "running"} for n in self.spawns["n2"]]}
            return {}
        if kind == "spawn_worker" and self.says_stopping and self.stopped_at is None:
            self.stopped_at = time.monotonic()
            raise ActorStopped("node n1 is stopping; it starts no worker")
        self.stopped_at = self.stopped_at or time.monotonic()
        if kind == "spawn_worker" and self.dead_after(payload["name"]):
            self.n1_dead = True
        await anyio.sleep(timeout)  # sent to where nobody listens any more
        raise AskTimeout(f"no reply to {kind!r} from {endpoint} within {timeout}s")

    def _node(self, name: str) -> dict[str, Any]:
        stopped = self.stopped_at if name == "n1" else None
        return {
            "node": name,
            "endpoint": f"tcp://{name}:1",
            "alive": not (name == "n1" and self.n1_dead),
            "tags": [],
            "resources": {},
            "last_beat_age_s": 0.0 if stopped is None else time.monotonic() - stopped,
        }

    def ref(self, path: str) -> Any:
        return OkReplica()


async def _run(cluster: Cluster, on_event: Callable[[str], None]) -> tuple[PipelineResult, PipelineEngine]:
    cfg = PipelineConfig.model_validate(
        {"name": "p", "items": 4, "scale_interval_s": 3600.0, "stages": [{"name": "a", "actor": "m:Stage"}]}
    )
    hosts = EngineHosts(cluster.hosts, MASTER, cluster, refresh_s=0.01)  # type: ignore[arg-type]
    engine = PipelineEngine(
        cfg,
        cluster,  # type: ignore[arg-type]
        "tcp://n1:1",
        on_event=on_event,
        source=LocalSource(cfg.name, cfg.items),
        hosts=hosts,
        nodes_outlive_run=False,
    )
    with anyio.fail_after(WAIT_S):
        return await engine.run(), engine


async def test_a_node_that_said_it_stops_is_not_tried_again_while_another_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """n1 said it stops; the master still lists it (for its node timeout). Once the run no longer
    avoided it (``_AVOID_S``: a replica replacing one lost there, later), n1, running none, was
    its pick: the replica goes to n2."""
    monkeypatch.setattr(replicas_module, "_AVOID_S", 0.0)
    cluster = Cluster(with_n2=True)
    said: list[str] = []
    result, engine = await _run(cluster, said.append)
    assert result.counts()["ok"] == 4
    assert cluster.spawns["n1"] == ["p-a-0"], cluster.spawns  # told it stops: never asked again
    assert set(engine.placement.values()) == {"n2"}
    assert "could not start on node n1 (ActorStopped: node n1 is stopping" in said[0], said


async def test_a_run_whose_only_node_said_it_stops_waits_for_a_node_and_says_it_is_gone() -> None:
    """n1, the only node, said it stops: no spawn goes to it again. The run tries again as for a
    node gone (NoNodeNow), then ends saying so, not after a spawn's whole deadline."""
    cluster = Cluster(with_n2=False)
    said: list[str] = []
    with pytest.raises(StageFailed, match="the node that offered them is gone") as failed:
        await _run(cluster, said.append)
    assert "stage a: replica p-a-12 could not start" in str(failed.value)
    assert cluster.spawns["n1"] == ["p-a-0"], cluster.spawns
    assert all("NoNodeNow" in line for line in said[1:]) and len(said) == 12, said


async def test_a_spawn_in_flight_ends_when_the_master_has_its_node_as_dead() -> None:
    """n1 exited between two starts (no connection to lose): the spawn sent to it is answered by
    nobody, and the master declares n1 dead. The spawn ends then and the replica goes to n2."""
    cluster = Cluster(with_n2=True, says_stopping=False, dead_after=lambda replica: True)
    said: list[str] = []
    result, engine = await _run(cluster, said.append)
    assert result.counts()["ok"] == 4
    assert cluster.spawns["n1"] == ["p-a-0"] and set(engine.placement.values()) == {"n2"}
    assert "could not start on node n1 (Unreachable: node n1 left the cluster" in said[0], said


async def test_a_slow_start_on_a_node_that_does_not_answer_blames_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The spawn to n1 hangs and n1 answers nothing: the slow-start line says the node does not
    answer (it said "its imports or its constructor"). The master then declares n1 dead: the
    spawn ends, and the run, without a node, ends saying the node is gone."""
    monkeypatch.setattr(replicas_module, "_SLOW_START_S", 0.01)
    monkeypatch.setattr(replicas_module, "_WATCH_S", 0.01)  # how long the node is waited for
    said: list[str] = []
    cluster = Cluster(with_n2=False, says_stopping=False)

    def event(line: str) -> None:
        said.append(line)
        if "has been starting for" in line:  # the master's verdict comes after the line
            cluster.n1_dead = True

    with pytest.raises(StageFailed, match="the node that offered them is gone"):
        await _run(cluster, event)
    slow = [line for line in said if "has been starting for" in line]
    assert slow and "on node n1, which does not answer at tcp://n1:1" in slow[0], said
    assert "imports" not in slow[0] and "once the master has the node as dead" in slow[0], slow
    assert "(Unreachable: node n1 left the cluster" in said[len(slow)], said


async def test_a_node_that_said_it_stops_gets_replicas_again_once_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It is picked again once the master has dropped it and lists it again (a node restarted
    after its node timeout joins anew), or hears it beat ``_STOPPING_S`` after it said it stops
    (one restarted sooner); not while its last beat is older."""
    master = _Master([{"node": "n1", "endpoint": "tcp://n1:1", "alive": True, "last_beat_age_s": 0.0}])
    n1 = Host("n1", "tcp://n1:1")
    hosts = EngineHosts([n1], MASTER, master, refresh_s=0.001)  # type: ignore[arg-type]
    monkeypatch.setattr(hosts_module, "_STOPPING_S", 0.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(hosts.watch)
        assert hosts.pick("s") == n1
        hosts.stopping(n1)
        master.set(alive=True, last_beat_age_s=3600.0)  # its last beat: before it said it stops
        await master.answered(2)
        with pytest.raises(NoNodeNow, match="the node that offered them is gone"):
            hosts.pick("s")
        master.set(alive=True, last_beat_age_s=0.0)  # it beats again: restarted
        await master.answered(2)
        assert hosts.pick("s") == n1

        monkeypatch.setattr(hosts_module, "_STOPPING_S", 3600.0)
        hosts.stopping(n1)
        master.set(alive=True, last_beat_age_s=0.0)  # still stopping: it beats meanwhile
        await master.answered(2)
        with pytest.raises(NoNodeNow):
            hosts.pick("s")
        master.set(alive=False, last_beat_age_s=12.0)  # declared dead
        await master.answered(2)
        master.set(alive=True, last_beat_age_s=0.0)  # back: it joins anew
        await master.answered(2)
        assert hosts.pick("s") == n1
        tg.cancel_scope.cancel()


class _Master:
    """Answers ``status`` with one node, as ``set`` last said; counts its answers."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.count = 0
        self._answer = anyio.Event()

    def set(self, **fields: Any) -> None:
        self.nodes = [{**self.nodes[0], **fields}]

    async def answered(self, times: int) -> None:
        """Return once it answered ``times`` more (bounded)."""
        with anyio.fail_after(WAIT_S):
            until = self.count + times
            while self.count < until:
                await self._answer.wait()

    async def control(self, master: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        assert msg_type == "status"
        self.count += 1
        self._answer.set()
        self._answer = anyio.Event()
        return {"master": "master", "nodes": list(self.nodes)}
