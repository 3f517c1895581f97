"""The engine's side of the direct data plane and of placement, without processes: fake nodes
and replicas whose calls wait until the test answers them.

What a user relies on: a held output reaches the next stage as a reference to its holder (the
frames never pass through the engine) and is released once settled there; an item whose held
payload is lost runs again from the first stage; a node that dies takes its replicas with it:
their calls are retried on live nodes, and the items they held are restarted, none lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine, PipelineResult
from troupe.runtime.pipeline.hosts import EngineHosts
from troupe.runtime.placement import Host

WAIT_S = 10  # bound on every wait for the engine; never a bound on speed


@dataclass
class Call:
    replica: str
    kind: str
    payload: dict[str, Any]
    answered: anyio.Event = field(default_factory=anyio.Event)
    reply: Any = None
    cancelled: bool = False

    @property
    def stage(self) -> str:
        return self.replica.split("-")[1]  # "{pipeline}-{stage}-{n}"

    def answer(self, *outcomes: dict[str, Any]) -> None:
        self.reply = {"outcomes": list(outcomes)}
        self.answered.set()

    def hold(self) -> None:
        """Every item held by the replica, under the keys the engine gave."""
        self.answer(*({"held": key, "bytes": 1 << 22} for key in self.payload["hold"]))

    def ok(self) -> None:
        self.answer(*({"ok": {"n": i}} for i in range(len(self.payload["items"]))))


class FakeCluster:
    """Nodes that start replicas at once; replicas that hand every call to the test."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.tells: list[tuple[str, str, Any]] = []
        self.spawned: dict[str, str] = {}  # replica -> node endpoint
        self.stopped: list[str] = []
        self.states: dict[str, str] = {}  # a worker's state as its node tells (default running)
        self.told: dict[str, Any] = {}  # replica -> what its stage_info said to it
        self.arrived = anyio.Event()

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "spawn_worker":
            self.spawned[payload["name"]] = endpoint
        elif kind == "stop_worker":
            self.stopped.append(payload["name"])
        elif kind == "supervision":  # the engine's look at its replicas' workers
            running = [n for n in self.spawned if n not in self.stopped]
            return {"workers": [{"name": n, "state": self.states.get(n, "running")} for n in running]}
        elif kind != "ping":  # a stop's look at whether the node lives (runtime/worker_stop.py)
            raise AssertionError(f"unexpected control {kind!r}")
        return {}

    def ref(self, path: str) -> FakeRef:
        return FakeRef(self, path)

    def pending(self, stage: str | None = None) -> list[Call]:
        return [
            c for c in self.calls if not c.answered.is_set() and not c.cancelled and stage in (None, c.stage)
        ]

    def _changed(self) -> None:
        self.arrived.set()
        self.arrived = anyio.Event()

    async def wait_for(self, what: str, done: Callable[[], bool]) -> None:
        with anyio.fail_after(WAIT_S):
            while not done():
                await self.arrived.wait()
        assert done(), what

    async def next_call(self, stage: str) -> Call:
        await self.wait_for(f"a call to {stage}", lambda: bool(self.pending(stage)))
        return self.pending(stage)[0]


class FakeRef:
    def __init__(self, cluster: FakeCluster, path: str) -> None:
        self.cluster = cluster
        self.path = path

    async def ask(self, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "stage_info":
            self.cluster.told[self.path.split("/")[0]] = payload
            return {"hooks": []}
        call = Call(self.path.split("/")[0], kind, payload)
        self.cluster.calls.append(call)
        self.cluster._changed()
        try:
            await call.answered.wait()
        except anyio.get_cancelled_exc_class():
            call.cancelled = True
            self.cluster._changed()
            raise
        return call.reply

    async def tell(self, kind: str, payload: Any, **options: Any) -> None:
        self.cluster.tells.append((self.path, kind, payload))
        self.cluster._changed()


def _pipeline(items: int, *stages: dict[str, Any]) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {"name": "p", "items": items, "scale_interval_s": 3600.0, "stages": list(stages)}
    )


def _stage(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "actor": "fake.module:Stage", "inflight": 1, **fields}


async def _run(
    cfg: PipelineConfig,
    cluster: FakeCluster,
    drive: Callable[[], Awaitable[None]],
    hosts: EngineHosts | None = None,
) -> PipelineResult:
    engine = PipelineEngine(cfg, cluster, "tcp://fake:1", hosts=hosts)  # type: ignore[arg-type]
    with anyio.fail_after(WAIT_S * 3):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            result = await engine.run()
            tg.cancel_scope.cancel()
    return result


async def _finish(cluster: FakeCluster) -> None:
    """Answer every call from now on: held where the engine asks to hold, else ok."""
    while True:
        await cluster.wait_for("a call", lambda: bool(cluster.pending()))
        call = cluster.pending()[0]
        call.hold() if "hold" in call.payload else call.ok()


def _hosts(*names: str, tags: dict[str, list[str]] | None = None) -> EngineHosts:
    tags = tags or {}
    return EngineHosts([Host(n, f"tcp://{n}:1", frozenset(tags.get(n, ()))) for n in names])


async def test_a_held_output_goes_to_the_next_stage_by_reference_and_is_released_once_settled() -> None:
    cluster = FakeCluster()
    cfg = _pipeline(1, _stage("a"), _stage("b"))

    async def drive() -> None:
        a = await cluster.next_call("a")
        assert a.kind == "process" or "from" not in a.payload  # the first stage's input is inline
        assert len(a.payload["hold"]) == 1
        a.hold()
        b = await cluster.next_call("b")
        assert b.kind == "process_direct"
        assert b.payload["items"] == [None]  # no payload through the engine...
        assert b.payload["from"] == [[f"{a.replica}/outbox", a.payload["hold"][0]]]  # ...but where it is
        assert "hold" not in b.payload  # the last stage's outputs come back to the engine
        assert not cluster.tells  # held until the next stage settled it
        b.ok()
        await cluster.wait_for("the release", lambda: bool(cluster.tells))
        assert cluster.tells == [(f"{a.replica}/outbox", "stage_release", {"keys": a.payload["hold"]})]

    result = await _run(cfg, cluster, drive)
    assert result.counts()["ok"] == 1
    assert result.restarted == 0


async def test_each_replica_is_told_its_stage_s_name() -> None:
    """What its items' errors name (an output that cannot travel: "stage a: process ...")."""
    cluster = FakeCluster()
    result = await _run(_pipeline(1, _stage("a"), _stage("b")), cluster, lambda: _finish(cluster))
    assert result.counts()["ok"] == 1
    assert sorted(cluster.told) == sorted(cluster.spawned)
    assert all(told == {"stage": replica.split("-")[1]} for replica, told in cluster.told.items())


async def test_with_the_engine_data_plane_nothing_is_held() -> None:
    cluster = FakeCluster()
    cfg = PipelineConfig.model_validate(
        {"name": "p", "items": 2, "data_plane": "engine", "stages": [_stage("a"), _stage("b")]}
    )

    async def drive() -> None:
        while True:
            await cluster.wait_for("a call", lambda: bool(cluster.pending()))
            call = cluster.pending()[0]
            assert call.kind == "process" and "hold" not in call.payload
            call.ok()

    result = await _run(cfg, cluster, drive)
    assert result.counts()["ok"] == 2


async def test_an_item_whose_held_input_is_lost_runs_again_from_the_first_stage() -> None:
    cluster = FakeCluster()
    cfg = _pipeline(1, _stage("a"), _stage("b"))

    async def drive() -> None:
        (await cluster.next_call("a")).hold()
        (await cluster.next_call("b")).answer({"lost": "holder p-a-0/outbox did not hand over its outputs"})
        again = await cluster.next_call("a")
        assert again.payload["items"][0]["attempt"] == 1  # told it is a second run
        again.hold()
        (await cluster.next_call("b")).ok()

    result = await _run(cfg, cluster, drive)
    assert result.counts()["ok"] == 1
    assert result.restarted == 1


async def test_replicas_spread_over_the_nodes_that_carry_the_stage_tags() -> None:
    cluster = FakeCluster()
    hosts = _hosts("n1", "n2", "n3", tags={"n3": ["store"]})
    cfg = _pipeline(4, _stage("a", replicas=2), _stage("store", resources={"tags": ["store"]}))

    result = await _run(cfg, cluster, lambda: _finish(cluster), hosts)
    assert result.counts()["ok"] == 4
    by_stage: dict[str, set[str]] = {}
    for replica, node in result.placement.items():
        by_stage.setdefault(replica.split("-")[1], set()).add(node)
    assert by_stage == {"a": {"n1", "n2"}, "store": {"n3"}}  # one a per node before any second


async def test_a_dead_nodes_outstanding_call_is_retried_on_a_live_node() -> None:
    cluster = FakeCluster()
    hosts = _hosts("n1", "n2", "n3", tags={"n2": ["x"], "n3": ["x"]})
    cfg = _pipeline(1, _stage("a", resources={"tags": ["x"]}))

    async def drive() -> None:
        call = await cluster.next_call("a")
        assert cluster.spawned[call.replica] == "tcp://n2:1"
        hosts.hosts = [h for h in hosts.hosts if h.name != "n2"]  # n2 stops beating
        hosts.changed.set()
        await cluster.wait_for("the call on n2 cancelled", lambda: call.cancelled)
        again = await cluster.next_call("a")
        assert cluster.spawned[again.replica] == "tcp://n3:1"  # the live node with the tag
        again.ok()

    result = await _run(cfg, cluster, drive, hosts)
    assert result.counts()["ok"] == 1
    assert sorted(result.placement.values()) == ["n2", "n3"]
    dead = next(r for r, node in result.placement.items() if node == "n2")
    assert dead not in cluster.stopped  # a dead node is not asked to stop anything


async def test_what_a_dead_node_held_runs_again_and_nothing_is_lost() -> None:
    cluster = FakeCluster()
    hosts = _hosts("n1", "n2")
    cfg = _pipeline(3, _stage("a", replicas=2), _stage("b", queue=4))

    async def drive() -> None:
        await cluster.wait_for("both a replicas called", lambda: len(cluster.pending("a")) == 2)
        on_n2 = next(c for c in cluster.pending("a") if cluster.spawned[c.replica] == "tcp://n2:1")
        on_n1 = next(c for c in cluster.pending("a") if c is not on_n2)
        on_n1.hold()
        b = await cluster.next_call("b")  # b works on the n1 item (inflight 1)...
        on_n2.hold()  # ...so the n2 item waits in b's queue, its payload held on n2
        await cluster.wait_for("the third item on n1", lambda: len(cluster.pending("a")) == 1)
        hosts.hosts = [h for h in hosts.hosts if h.name != "n2"]  # n2 stops beating
        hosts.changed.set()
        await cluster.wait_for("a replacement on n1", lambda: len(cluster.spawned) == 4)
        b.ok()
        await _finish(cluster)

    result = await _run(cfg, cluster, drive, hosts)
    assert result.counts()["ok"] == 3  # nothing lost
    assert result.restarted == 1  # the item n2 held ran again from the first stage
    assert list(cluster.spawned.values()).count("tcp://n1:1") == 3  # a-0, b, and a's replacement


async def test_a_replica_whose_worker_died_is_replaced_and_its_call_retried() -> None:
    """The node tells (its workers' records) that a replica's worker exited: the engine stops
    waiting for the call it had there and runs the item on a new replica."""
    cluster = FakeCluster()
    cfg = _pipeline(1, _stage("a"))

    async def drive() -> None:
        call = await cluster.next_call("a")
        cluster.states[call.replica] = "exited"  # killed; its node may restart it, empty
        await cluster.wait_for("the call given up", lambda: call.cancelled)
        again = await cluster.next_call("a")
        assert again.replica != call.replica
        again.ok()

    result = await _run(cfg, cluster, drive)
    assert result.counts()["ok"] == 1
    assert len(result.placement) == 2


async def test_no_call_pulls_from_a_replica_lost_with_the_node_of_the_call_it_waited_behind() -> None:
    """One node held both item payloads (stage a) and ran stage b, whose second call waited
    behind its first: the node dies. The waiting call's item went back to b's queue naming its
    lost holder, and b's new replica waited a minute for a pull that could not come; now both
    items run again from the first stage."""
    cluster = FakeCluster()
    hosts = _hosts("n2", tags={"n2": ["x"]})
    cfg = _pipeline(
        2, _stage("a", resources={"tags": ["x"]}), _stage("b", inflight=2, resources={"tags": ["x"]})
    )
    lost_holder: list[str] = []

    async def drive() -> None:
        first = await cluster.next_call("a")
        lost_holder.append(f"{first.replica}/outbox")
        first.hold()
        (await cluster.next_call("a")).hold()
        await cluster.wait_for("both b calls", lambda: len(cluster.pending("b")) == 2)
        on_n2 = cluster.pending("b")
        hosts.hosts = [Host("n3", "tcp://n3:1", frozenset({"x"}))]  # n2 dies, n3 has joined
        hosts.changed.set()
        await cluster.wait_for("b's calls on n2 given up", lambda: all(c.cancelled for c in on_n2))
        while True:
            await cluster.wait_for("a call", lambda: bool(cluster.pending()))
            call = cluster.pending()[0]
            pulled_from = [source[0] for source in call.payload.get("from") or [] if source]
            assert lost_holder[0] not in pulled_from, call.payload
            call.hold() if "hold" in call.payload else call.ok()

    result = await _run(cfg, cluster, drive, hosts)
    assert result.counts()["ok"] == 2  # nothing lost
    assert result.restarted == 2  # both payloads were on the dead node


async def test_a_replica_retired_during_its_call_stays_until_the_next_stage_took_what_it_holds() -> None:
    """The scaler lent a busy replica's slot to another stage ("idle, lends a slot to store"): once its
    call ended it was stopped, holding that call's outputs, and the next stage's pull of them waited
    out its minute on a process that was gone (a `troupe run` of 6 items stalled with two leased).
    It now stays until the next stage has settled what it holds, then goes."""
    cluster = FakeCluster()
    engine = PipelineEngine(_pipeline(1, _stage("a"), _stage("b")), cluster, "tcp://fake:1")  # type: ignore[arg-type]

    async def drive() -> None:
        a = await cluster.next_call("a")
        stage = engine.stages[0]
        replica = next(r for r in stage.replicas if r.name == a.replica)
        engine._mark_retiring(stage, replica)  # lent while its call runs
        a.hold()
        b = await cluster.next_call("b")  # the call has ended: its retirement may go on
        assert engine._tg is not None and replica.held == 1
        engine._tg.start_soon(engine._retire, stage, replica)
        await anyio.wait_all_tasks_blocked()
        assert a.replica not in cluster.stopped, "stopped while b has yet to pull from it"
        b.ok()
        with anyio.fail_after(WAIT_S):  # released once b settled it: then it goes
            while a.replica not in cluster.stopped:
                await anyio.sleep(0.01)

    with anyio.fail_after(WAIT_S * 3):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            result = await engine.run()
            tg.cancel_scope.cancel()
    assert result.counts()["ok"] == 1
    assert result.restarted == 0
