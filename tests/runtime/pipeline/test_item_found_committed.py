"""An item whose output its store committed, and whose store call then failed (its replica
killed right after the commit, before it answered), ends ok: it was counted dead on its last
attempt while its episode was in the dataset (report jx 4: "3 ok, 1 dead" and 4 episodes), or
run again (its attempt spent) with attempts left. The engine now asks the stage, where it
defines ``committed_among``, before it retries or dead-letters such an item."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from support.recording_node import NODE, RecordingNode
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.source import LocalSource

HANG_GUARD_S = 60  # a bound on a hang, never on speed
DIES = "p-000001"  # its store commits it, then fails the call


class _Store:
    """A store stage's replicas: each commits what it is given, and the call of ``DIES`` fails
    after its commit, as a replica killed before it answered fails it."""

    def __init__(self, hooks: list[str]) -> None:
        self.hooks = hooks
        self.committed: set[str] = set()
        self.asked: list[list[str]] = []
        self.calls: list[str] = []

    async def ask(self, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "stage_info":
            return {"hooks": self.hooks}
        if kind == "stage_committed":
            self.asked.append(payload["task_ids"])
            return {"committed": sorted(self.committed.intersection(payload["task_ids"]))}
        outcomes = []
        for item in payload["items"]:
            self.calls.append(item["task_id"])
            self.committed.add(item["task_id"])
            if item["task_id"] == DIES:
                outcomes.append({"error": "Unreachable: a replica of stage store: its worker has exited"})
            else:
                outcomes.append({"ok": item})
        return {"outcomes": outcomes}


class _StoreNode(RecordingNode):
    def __init__(self, store: _Store) -> None:
        super().__init__()
        self.store = store

    def ref(self, path: str) -> Any:
        return self.store


class _Recorded(LocalSource):
    """The items' settles, as a master source gets them; ``retries_locally`` False: the master
    decides what an error becomes (a retry, or a dead letter on the last attempt)."""

    def __init__(self, retries_locally: bool) -> None:
        super().__init__("p", 3)
        self.retries_locally = retries_locally  # type: ignore[misc]
        self.settled: dict[str, str] = {}

    def settle(self, task_id: str, outcome: str, error: str = "", traceback: str = "") -> None:
        self.settled[task_id] = outcome


def _engine(node: _StoreNode, source: LocalSource, max_attempts: int) -> PipelineEngine:
    cfg = PipelineConfig.model_validate(
        {
            "name": "p",
            "items": 3,
            "max_attempts": max_attempts,
            "scale_interval_s": 3600.0,
            "stages": [{"name": "store", "actor": "m:Store"}],
        }
    )
    return PipelineEngine(cfg, node, NODE, source=source)  # type: ignore[arg-type]


@pytest.mark.parametrize("retries_locally", [True, False])
@pytest.mark.parametrize("max_attempts", [1, 2])
async def test_an_item_committed_before_its_store_call_failed_ends_ok(
    retries_locally: bool, max_attempts: int
) -> None:
    store = _Store(["committed_among"])
    source = _Recorded(retries_locally)
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(_StoreNode(store), source, max_attempts).run()
    assert result.counts() == {"ok": 3, "pruned": 0, "dead": 0, "kept": 0}
    assert source.settled == {"p-000000": "ok", "p-000001": "ok", "p-000002": "ok"}
    assert store.asked == [[DIES]]  # only of the item whose call failed
    assert store.calls.count(DIES) == 1  # not run again


async def test_a_store_that_cannot_say_leaves_the_item_to_its_retries() -> None:
    """A stage without the hook is not asked: its failed item is retried, dead on its last."""
    store = _Store([])
    source = _Recorded(retries_locally=True)
    with anyio.fail_after(HANG_GUARD_S):
        result = await _engine(_StoreNode(store), source, 1).run()
    assert result.counts() == {"ok": 2, "pruned": 0, "dead": 1, "kept": 0}
    assert store.asked == []
