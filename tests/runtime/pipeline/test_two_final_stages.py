"""An item a stage passes on to two final stages (both ``after`` it, both making outputs) settles
once, as the last of its branches ends: its source is told once, and it is counted once, ok
where either branch ended ok (a committed output is the truth), else the gravest end.

Each branch's end settled it: an item one branch made and the other failed was counted ok and
then dead (the second settle overwrote the first), and where the failing stage's retry found it
committed by the other's ``committed_among`` it was settled ok twice (session 45, pl 2)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from support.recording_node import NODE, RecordingNode
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.source import LocalSource

HANG_GUARD_S = 60  # a bound on a hang, never on speed
ITEMS = 3
ODD = "p-000001"  # the item whose branches end as a test says; the others end ok in both


class _Branches:
    """The replicas of stages ``g`` (passes each item on), ``a`` and ``b`` (its two final
    stages). ``ends`` says how ``a`` and ``b`` end ``ODD`` (``ok``, ``pruned`` or ``error``);
    the branch named ``first`` answers for it before the other does."""

    def __init__(self, ends: dict[str, str | list[str]], first: str, a_hooks: list[str]) -> None:
        self.ends = ends  # a list: one end a call, in turn
        self.first = first
        self.a_hooks = a_hooks
        self.answered = anyio.Event()  # the first branch answered for ODD
        self.committed: set[str] = set()  # by stage a
        self.asked: list[list[str]] = []  # a's committed_among
        self.calls: list[str] = []  # the stages that were called with ODD

    def replica(self, stage: str) -> Any:
        branches = self

        class Replica:
            async def ask(self, kind: str, payload: Any, timeout: float | None = None) -> Any:
                if kind == "stage_info":
                    return {"hooks": branches.a_hooks if stage == "a" else []}
                if kind == "stage_committed":
                    branches.asked.append(payload["task_ids"])
                    return {"committed": sorted(branches.committed.intersection(payload["task_ids"]))}
                return {"outcomes": [await branches.outcome(stage, item) for item in payload["items"]]}

        return Replica()

    async def outcome(self, stage: str, item: dict[str, Any]) -> dict[str, Any]:
        task_id = item["task_id"]
        if stage == "g" or task_id != ODD:
            end = "ok"
        else:
            self.calls.append(stage)
            if stage != self.first:
                await self.answered.wait()
            ends = self.ends[stage]
            end = ends.pop(0) if isinstance(ends, list) else ends
        if stage == "a" and end == "ok":
            self.committed.add(task_id)
        if stage in ("a", "b") and task_id == ODD and stage == self.first:
            self.answered.set()
        if end == "ok":
            return {"ok": item}
        if end == "pruned":
            return {"pruned": f"stage {stage} prunes it"}
        return {"error": f"stage {stage} failed", "traceback": ""}


class _Node(RecordingNode):
    def __init__(self, branches: _Branches) -> None:
        super().__init__()
        self.branches = branches

    def ref(self, path: str) -> Any:
        return self.branches.replica(path.split("/")[0].split("-")[1])  # p-STAGE-N/stage


class _Recorded(LocalSource):
    """Every settle, in order; ``retries_locally`` False as a master's source."""

    def __init__(self, retries_locally: bool) -> None:
        super().__init__("p", ITEMS)
        self.retries_locally = retries_locally  # type: ignore[misc]
        self.settles: list[tuple[str, str]] = []

    def settle(self, task_id: str, outcome: str, error: str = "", traceback: str = "") -> None:
        self.settles.append((task_id, outcome))


def _engine(branches: _Branches, source: LocalSource, max_attempts: int = 1) -> PipelineEngine:
    stage = {"actor": "m:Stage", "batch": 1, "inflight": 1}
    cfg = PipelineConfig.model_validate(
        {
            "name": "p",
            "items": ITEMS,
            "max_attempts": max_attempts,
            "scale_interval_s": 3600.0,
            "data_plane": "engine",
            "stages": [
                {"name": "g", **stage},
                {"name": "a", "after": "g", **stage},
                {"name": "b", "after": "g", **stage},
            ],
        }
    )
    return PipelineEngine(cfg, _Node(branches), NODE, source=source)  # type: ignore[arg-type]


@pytest.mark.parametrize("first", ["a", "b"])
@pytest.mark.parametrize(
    ("a_end", "b_end", "outcome"),
    [
        ("ok", "error", "ok"),  # a made it: ok, not ok and then dead
        ("error", "ok", "ok"),
        ("pruned", "ok", "ok"),
        ("pruned", "pruned", "pruned"),
        ("error", "pruned", "dead"),
    ],
)
async def test_an_item_of_two_final_stages_settles_once(
    first: str, a_end: str, b_end: str, outcome: str
) -> None:
    branches = _Branches({"a": a_end, "b": b_end}, first, a_hooks=[])
    source = _Recorded(retries_locally=True)
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(branches, source).run()
    assert result.outcomes[ODD] == outcome
    counts = {"ok": ITEMS - 1, "pruned": 0, "dead": 0, "kept": 0}
    counts[outcome] += 1
    assert result.counts() == counts
    assert sorted(source.settles) == sorted(
        [(f"p-{i:06d}", "ok") for i in range(ITEMS) if f"p-{i:06d}" != ODD] + [(ODD, outcome)]
    )


async def test_an_item_one_branch_committed_and_the_other_failed_is_told_its_master_once() -> None:
    """Stage b fails the item a committed (a has ``committed_among``): the master is told it
    ended ok once, not once per branch."""
    branches = _Branches({"a": "ok", "b": "error"}, "a", a_hooks=["committed_among"])
    source = _Recorded(retries_locally=False)
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(branches, source).run()
    assert result.counts() == {"ok": ITEMS, "pruned": 0, "dead": 0, "kept": 0}
    assert sorted(source.settles) == [(f"p-{i:06d}", "ok") for i in range(ITEMS)]


async def test_a_failed_final_stage_is_retried_though_the_other_committed_the_item() -> None:
    """Stage b's retry of the item is not skipped because stage a (the other final stage, with
    ``committed_among``) committed it: a's commit says nothing of b's output. It was taken as
    found committed, and b's output of it was never made (pl 2b)."""
    branches = _Branches({"a": "ok", "b": ["error", "ok"]}, "a", a_hooks=["committed_among"])
    source = _Recorded(retries_locally=True)
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(branches, source, max_attempts=2).run()
    assert result.counts() == {"ok": ITEMS, "pruned": 0, "dead": 0, "kept": 0}
    assert branches.calls.count("b") == 2  # retried, and made
    assert branches.asked == []  # a was not asked about b's failure
