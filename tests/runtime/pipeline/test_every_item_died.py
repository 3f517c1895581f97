"""A run whose every item died or was pruned made nothing, and runs no finalize hook: a finalize
over nothing could only fail (the dataset writer's: "no committed episodes ... write some with
write_episode first"), and that error stood where the run's own line belonged, the items' ends
and the way out, on the run and on every rerun (report ev 8; a planner that pruned every item)."""

from __future__ import annotations

from typing import Any

import anyio

from support.recording_node import NODE, RecordingNode
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.source import LocalSource

HANG_GUARD_S = 60  # a bound on a hang, never on speed


class _StoreReplica:
    """A store whose every item fails (a full disk), with a finalize hook that fails over no
    output, as the dataset writer's does; it records the hooks it was asked to run."""

    def __init__(self, asked: list[str], fails: bool, prunes: bool) -> None:
        self.asked, self.fails, self.prunes = asked, fails, prunes

    async def ask(self, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "stage_info":
            return {"hooks": ["finalize"]}
        if kind == "stage_finalize":
            self.asked.append(kind)
            return {"summary": "finalised"}
        if self.fails:
            return {"outcomes": [{"error": "OSError: no space left"} for _ in payload["items"]]}
        if self.prunes:
            return {"outcomes": [{"pruned": "no path to the goal"} for _ in payload["items"]]}
        return {"outcomes": [{"ok": it} for it in payload["items"]]}


class _StoreNode(RecordingNode):
    def __init__(self, fails: bool, prunes: bool = False) -> None:
        super().__init__()
        self.asked: list[str] = []
        self.fails, self.prunes = fails, prunes

    def ref(self, path: str) -> Any:
        return _StoreReplica(self.asked, self.fails, self.prunes)


class _EarlierRuns(LocalSource):
    """A job whose items all ended in earlier runs (none to hand out); ``ok``: those that ended
    ok, as the master answers ``done_tasks``."""

    def __init__(self, ok: set[str]) -> None:
        super().__init__("p", 0)
        self.ended_before = 3
        self.dead_before: set[str] = set()
        self.ok = ok

    async def ended_ok(self, task_ids: Any) -> set[str]:
        return self.ok.intersection(task_ids)


def _engine(node: _StoreNode, source: LocalSource) -> PipelineEngine:
    cfg = PipelineConfig.model_validate(
        {
            "name": "p",
            "items": 3,
            "max_attempts": 1,
            "scale_interval_s": 3600.0,
            "stages": [{"name": "store", "actor": "m:Store"}],
        }
    )
    return PipelineEngine(cfg, node, NODE, source=source)  # type: ignore[arg-type]


async def test_a_run_whose_every_item_died_finalises_nothing() -> None:
    node = _StoreNode(fails=True)
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(node, LocalSource("p", 3)).run()
    assert result.counts()["dead"] == 3 and result.made_nothing
    assert node.asked == [] and result.finals == {}


async def test_a_rerun_that_finds_every_item_dead_finalises_nothing() -> None:
    """The earlier run's dead (its journal's dead letters: the source's ``dead_before``) count:
    the rerun runs no item and made nothing either."""
    node = _StoreNode(fails=False)
    source = LocalSource("p", 0)  # the job's items all ended before: none to hand out
    source.dead_before = {"p-000000", "p-000001", "p-000002"}  # type: ignore[attr-defined]
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(node, source).run()
    assert result.made_nothing and node.asked == []


async def test_a_run_with_an_item_made_finalises() -> None:
    node = _StoreNode(fails=False)
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(node, LocalSource("p", 3)).run()
    assert not result.made_nothing and node.asked == ["stage_finalize"]


async def test_a_run_whose_every_item_was_pruned_finalises_nothing() -> None:
    node = _StoreNode(fails=False, prunes=True)
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(node, LocalSource("p", 3)).run()
    assert result.counts()["pruned"] == 3 and result.made_nothing
    assert node.asked == [] and result.errors["p-000000"] == "no path to the goal"


async def test_a_rerun_after_runs_that_pruned_every_item_finalises_nothing() -> None:
    node = _StoreNode(fails=False)
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(node, _EarlierRuns(ok=set())).run()
    assert result.made_nothing and node.asked == []


async def test_a_rerun_after_a_run_that_made_an_item_finalises() -> None:
    node = _StoreNode(fails=False)
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(node, _EarlierRuns(ok={"p-000001"})).run()
    assert not result.made_nothing and node.asked == ["stage_finalize"]
