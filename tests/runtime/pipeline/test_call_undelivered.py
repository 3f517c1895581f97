"""A call that finds no actor at its replica (``UnknownActor``: the replica's worker was
SIGKILLed and its node restarted a worker of the name, which had not spawned its actor yet) was
never delivered: its items go to another replica with no attempt counted. It cost each an
attempt, and with ``max_attempts`` low an item that never ran was dead-lettered (session 44's
debug runs, 2 of 10). Bounded: an item that finds the actor missing again and again costs an
attempt at last, said in the log, so that a stage whose actor is never there still ends."""

from __future__ import annotations

from typing import Any

import anyio
from structlog.testing import capture_logs

from support.ok_replica import OkReplica
from support.recording_node import NODE, RecordingNode
from troupe.runtime.errors import UnknownActor
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.source import LocalSource

HANG_GUARD_S = 60  # a bound on a hang, never on speed
ITEMS = 4


class _Restarted(OkReplica):
    """A replica whose worker was restarted empty: it answered its start, and then its actor
    is missing for ``missing`` process calls (every one where None)."""

    def __init__(self, missing: int | None) -> None:
        self.missing = missing
        self.processed: list[str] = []

    async def ask(self, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind != "stage_info":
            if self.missing is None or self.missing > 0:
                if self.missing is not None:
                    self.missing -= 1
                raise UnknownActor("no actor named stage in n1/p-a-0; actors here: []")
            self.processed += [it["task_id"] for it in payload["items"]]
        return await super().ask(kind, payload, timeout)


class _Node(RecordingNode):
    """Its first replica's actor is missing for one call (``first_missing`` 1), or every replica's
    for every call (``first_missing`` None)."""

    def __init__(self, first_missing: int | None) -> None:
        super().__init__()
        self.first_missing = first_missing
        self.replicas: list[_Restarted] = []

    def ref(self, path: str) -> Any:
        missing = self.first_missing if not self.replicas or self.first_missing is None else 0
        self.replicas.append(_Restarted(missing))
        return self.replicas[-1]


def _engine(node: _Node) -> PipelineEngine:
    cfg = PipelineConfig.model_validate(
        {
            "name": "p",
            "items": ITEMS,
            "max_attempts": 1,  # one failed call is an item's death
            "scale_interval_s": 3600.0,
            "stages": [{"name": "a", "actor": "m:Stage", "batch": 1, "inflight": 1}],
        }
    )
    return PipelineEngine(cfg, node, NODE, source=LocalSource(cfg.name, cfg.items))  # type: ignore[arg-type]


async def test_an_undelivered_call_costs_its_item_no_attempt() -> None:
    node = _Node(first_missing=1)
    with capture_logs() as logs, anyio.fail_after(HANG_GUARD_S):
        result = await _engine(node).run()
    assert result.counts() == {"ok": ITEMS, "pruned": 0, "dead": 0, "kept": 0}
    ran = [task_id for replica in node.replicas for task_id in replica.processed]
    assert sorted(ran) == [f"p-{i:06d}" for i in range(ITEMS)]  # each ran once, none lost
    assert node.replicas[0].processed == []  # the restarted replica was given nothing again
    assert len(node.replicas) >= 2  # it was replaced
    requeued = [e for e in logs if e["event"] == "stage_call_requeued"]
    assert [e["task_ids"] for e in requeued] == [["p-000000"]]
    assert "UnknownActor" in requeued[0]["why"]


async def test_an_actor_never_there_costs_an_attempt_at_last() -> None:
    """Every replica's actor is missing: each item is put back a bounded number of times, then
    its call costs the attempt (dead at max_attempts 1), said once per item; the run ends."""
    node = _Node(first_missing=None)
    with capture_logs() as logs, anyio.fail_after(HANG_GUARD_S):
        result = await _engine(node).run()
    assert result.counts() == {"ok": 0, "pruned": 0, "dead": ITEMS, "kept": 0}
    assert all("UnknownActor" in error for error in result.errors.values()), result.errors
    counted = [e for e in logs if e["event"] == "stage_call_undelivered_counted"]
    assert sorted(t for e in counted for t in e["task_ids"]) == [f"p-{i:06d}" for i in range(ITEMS)]
    requeued = [t for e in logs if e["event"] == "stage_call_requeued" for t in e["task_ids"]]
    assert sorted(set(requeued)) == [f"p-{i:06d}" for i in range(ITEMS)]
    assert len(requeued) == ITEMS * 3  # put back three times each, not for ever
