"""The engine tells its run (``on_making``) once, before it may first make something: before it
first hands an item to the last stage (the one that commits an item's output), or calls its
first finalize hook. The run records its troupe code then (report rg 6: recorded as the run was
planned, a run stopped before it made anything stood in ``made_by`` for ever, and every later
run said the folder "mixes both"). Without processes: a fake node whose replicas record what
they are asked, in one list with the engine's word.
"""

from __future__ import annotations

from typing import Any

import anyio
from anyio.lowlevel import checkpoint

from support.recording_node import NODE, RecordingNode
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.source import LocalSource

HANG_GUARD_S = 60  # a bound on a hang, never on speed
ITEMS = 3


class _Replica:
    """Records each ask as ``stage:kind``; the store stage has a finalize hook; the load stage
    prunes every item where ``prunes``."""

    def __init__(self, said: list[str], stage: str, prunes: bool) -> None:
        self.said, self.stage, self.prunes = said, stage, prunes

    async def ask(self, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "stage_info":
            return {"hooks": ["finalize"] if self.stage == "store" else []}
        self.said.append(f"{self.stage}:{kind}")
        if kind == "stage_finalize":
            return {"summary": "finalised"}
        if self.prunes and self.stage == "load":
            return {"outcomes": [{"pruned": "no path to the goal"} for _ in payload["items"]]}
        return {"outcomes": [{"ok": it} for it in payload["items"]]}


class _Node(RecordingNode):
    def __init__(self, said: list[str], prunes: bool = False) -> None:
        super().__init__()
        self.said, self.prunes = said, prunes

    def ref(self, path: str) -> Any:
        return _Replica(self.said, "store" if "-store-" in path else "load", self.prunes)


class _EndedOkBefore(LocalSource):
    """A job whose items all ended ok in earlier runs (none to hand out), as the master
    answers ``done_tasks``."""

    def __init__(self) -> None:
        super().__init__("p", 0)
        self.ended_before = ITEMS
        self.dead_before: set[str] = set()

    async def ended_ok(self, task_ids: Any) -> set[str]:
        return set(task_ids)


def _engine(
    said: list[str], on_making: Any, prunes: bool = False, source: LocalSource | None = None
) -> PipelineEngine:
    cfg = PipelineConfig.model_validate(
        {
            "name": "p",
            "items": ITEMS,
            "scale_interval_s": 3600.0,
            "stages": [{"name": "load", "actor": "m:Load"}, {"name": "store", "actor": "m:Store"}],
        }
    )
    source = source or LocalSource(cfg.name, cfg.items)
    node = _Node(said, prunes)
    return PipelineEngine(cfg, node, NODE, source=source, on_making=on_making)  # type: ignore[arg-type]


async def test_the_run_is_told_once_before_its_last_stage_is_first_handed_an_item() -> None:
    """While the run's word is being taken (its record written), no item goes to the last
    stage: a SIGKILL right after a commit finds the code recorded."""
    said: list[str] = []
    noting, release = anyio.Event(), anyio.Event()

    async def on_making() -> None:
        said.append("noted")
        noting.set()
        await release.wait()

    engine = _engine(said, on_making)
    with anyio.fail_after(HANG_GUARD_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.run)
            await noting.wait()
            await anyio.wait_all_tasks_blocked()
            assert "store:process" not in said, said  # every call to the store waits for the word
            release.set()
    assert said.count("noted") == 1
    assert said.index("noted") < said.index("store:process")
    assert said.count("store:process") == ITEMS and said[-1] == "store:stage_finalize"


async def test_a_run_whose_items_never_reach_its_last_stage_tells_nothing() -> None:
    """Every item pruned before the last stage: nothing made, nothing finalised, no word (the
    folder's record keeps the codes that made what it holds, and no other)."""
    said: list[str] = []
    told: list[str] = []

    async def on_making() -> None:
        told.append("noted")

    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(said, on_making, prunes=True).run()
    assert result.made_nothing and told == []
    assert "store:process" not in said and "store:stage_finalize" not in said


async def test_a_rerun_that_only_finalises_tells_before_its_first_finalize_hook() -> None:
    """Every item ended ok in earlier runs (the last one stopped before it finalised): no item
    runs, and the finalize hooks (the dataset's files) are this run's making."""
    said: list[str] = []

    async def on_making() -> None:
        await checkpoint()
        said.append("noted")

    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(said, on_making, source=_EndedOkBefore()).run()
    assert result.counts()["ok"] == 0 and not result.made_nothing
    assert said == ["noted", "store:stage_finalize"]
