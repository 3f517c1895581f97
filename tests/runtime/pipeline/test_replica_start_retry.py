"""A replica whose start fails in a way that may pass is started again; one that fails the same
way every time fails the run at once. Without processes: a fake node whose ``spawn_worker``
fails as the test says.

What a user relies on: a node stopping gracefully, or a master restarting, while a run starts a
replica (a first one, or one replacing a lost one) no longer ends the run ("could not start"); the
run says it tries again, and goes on. A stage class that does not import still fails it at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from support.ok_replica import OkReplica
from troupe.runtime.errors import ActorStopped, AskTimeout, BadRequest, ConfigError, StageFailed, TroupeError
from troupe.runtime.pipeline import replicas as replicas_module
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine, PipelineResult
from troupe.runtime.pipeline.hosts import _AGAIN, _GONE, EngineHosts, NoNodeNow
from troupe.runtime.pipeline.source import LocalSource
from troupe.runtime.placement import Host

WAIT_S = 30  # bound on the whole run; never an upper bound on speed


class FlakyNode:
    """A runtime whose node fails the first spawns with ``failures`` (in order), then starts
    replicas at once; each replica answers every item ok."""

    def __init__(self, failures: list[TroupeError]) -> None:
        self.failures = list(failures)
        self.spawns: list[str] = []
        self.stopped: list[str] = []

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "spawn_worker":
            self.spawns.append(payload["name"])
            if self.failures:
                raise self.failures.pop(0)
        elif kind == "stop_worker":
            self.stopped.append(payload["name"])
        elif kind == "supervision":
            running = [n for n in self.spawns if n not in self.stopped]
            return {"workers": [{"name": n, "state": "running"} for n in running]}
        return {}

    def ref(self, path: str) -> Any:
        return OkReplica()


@pytest.fixture(autouse=True)
def short_pauses(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(replicas_module, "_RETRY_FIRST_S", 0.001)
    monkeypatch.setattr(replicas_module, "_RETRY_MAX_S", 0.002)
    yield


class _Source(LocalSource):
    """Counts the times the run gave its items back."""

    released = 0

    async def release(self) -> None:
        self.released += 1


async def _run(
    node: FlakyNode, said: list[str], source: _Source | None = None, endpoint: str = "tcp://fake:1"
) -> PipelineResult:
    cfg = PipelineConfig.model_validate(
        {"name": "p", "items": 4, "scale_interval_s": 3600.0, "stages": [{"name": "a", "actor": "m:Stage"}]}
    )
    engine = PipelineEngine(
        cfg,
        node,  # type: ignore[arg-type]
        endpoint,
        on_event=said.append,
        source=source or _Source(cfg.name, cfg.items),
    )
    with anyio.fail_after(WAIT_S):
        return await engine.run()


async def test_a_node_stopping_and_a_master_not_answering_are_tried_again() -> None:
    node = FlakyNode([ActorStopped("node n is stopping; it starts no worker"), AskTimeout("no reply")])
    said: list[str] = []
    result = await _run(node, said)
    assert result.counts()["ok"] == 4
    assert node.spawns == ["p-a-0", "p-a-1", "p-a-2"]
    assert "replica p-a-0 of stage a could not start (ActorStopped: node n is stopping" in said[0], said
    assert "trying again in" in said[0] and "(1/12)" in said[0] and "(2/12)" in said[1], said


async def test_a_start_that_keeps_failing_ends_the_run_after_its_tries() -> None:
    node = FlakyNode([AskTimeout("no reply")] * 13)
    said: list[str] = []
    with pytest.raises(StageFailed, match="stage a: replica p-a-12 could not start: no reply"):
        await _run(node, said)
    assert len(node.spawns) == 13 and len(said) == 12


async def test_a_stage_no_node_offers_any_more_ends_saying_the_run_gave_up() -> None:
    """i14 3: the run's last line, after its tries, said "the run tries again meanwhile", as each
    retry's line had, after the command had ended."""
    said_now = f"stages.a: no node has tags ['store']{_GONE}: {_AGAIN}"
    node = FlakyNode([NoNodeNow(said_now)] * 13)
    said: list[str] = []
    with pytest.raises(StageFailed) as failed:
        await _run(node, said)
    final = str(failed.value)
    assert "tries again meanwhile" in said[0] and "tries again meanwhile" not in final, final
    assert final.endswith(
        "the node that offered them is gone (start it again, or another that offers them): the run gave "
        "up after 13 tries; start a node that offers them, then the same command again resumes what it did"
    ), final


async def test_a_start_that_fails_the_same_way_every_time_ends_the_run_at_once() -> None:
    node = FlakyNode([ConfigError("a worker named 'p-a-0' already runs on node n")])
    said: list[str] = []
    source = _Source("p", 4)
    with pytest.raises(StageFailed, match="already runs"):
        await _run(node, said, source)
    assert node.spawns == ["p-a-0"] and said == []
    assert source.released == 1  # what it held goes back to the master: a rerun takes it at once


def test_a_node_that_failed_a_start_is_skipped_while_another_fits() -> None:
    a, b = Host("a", "tcp://a:1"), Host("b", "tcp://b:1", frozenset({"gpu-less"}))
    hosts = EngineHosts([a, b])
    assert hosts.pick("s").name == "a"
    hosts.gone("s", a)
    hosts.avoid(a, 60.0)
    assert hosts.pick("s").name == "b"  # a, the least loaded, is skipped
    only_a = EngineHosts([a])
    only_a.avoid(a, 60.0)
    assert only_a.pick("s").name == "a"  # the only node that fits is tried again all the same


async def test_a_worker_that_took_its_whole_start_time_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that waited the whole start time for the worker (an import that hangs) would wait
    as long again, twelve times over: that ends the run, as before."""
    monkeypatch.setattr(replicas_module, "_START_S", 0.0)  # every spawn "took" its whole time
    node = FlakyNode([AskTimeout("worker 'p-a-0' did not start within 120 s on node n")])
    said: list[str] = []
    with pytest.raises(StageFailed, match="did not start within"):
        await _run(node, said)
    assert node.spawns == ["p-a-0"] and said == []


class OlderNode(FlakyNode):
    """A node of before ``owner_process``: its spawn spec refuses the field, as any unknown one."""

    address = "tcp://127.0.0.1:9"  # the run's own endpoint: it names itself the owner

    def __init__(self) -> None:
        super().__init__([])
        self.payloads: list[dict[str, Any]] = []

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "spawn_worker":
            self.payloads.append(dict(payload))
            if "owner_process" in payload:
                raise BadRequest(
                    "control 'spawn_worker': field 'owner_process': Extra inputs are not permitted, "
                    f"got {payload['owner_process']!r}"
                )
        return await super().control(endpoint, kind, payload, timeout)


async def test_a_node_of_before_owner_process_starts_the_replicas_without_it() -> None:
    """A run upgraded before its cluster's nodes: every start failed ("Extra inputs are not
    permitted"). The node is asked again without the field, and not sent it again."""
    node = OlderNode()
    said: list[str] = []
    result = await _run(node, said, endpoint="tcp://127.0.0.1:1")  # a node the run can reach
    assert result.counts()["ok"] == 4 and said == []
    first, *rest = node.payloads
    assert "owner_process" in first and first["owner"] == node.address
    assert rest and all("owner_process" not in p and p["owner"] == node.address for p in rest)
