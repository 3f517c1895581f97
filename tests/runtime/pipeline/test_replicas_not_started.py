"""A replica that never comes up, as over a link from the run's host too slow for its start to
end (nw 4): a `troupe run --cluster` had every item done, then waited 300 s for the replica its
store's finalize needed, and ended in an ExceptionGroup of a bare TimeoutError (110 lines of
traceback, nothing telling the user to run it again, which finalised everything). The run now
fails in one line that names the stage, the node, the hook, and the way out.

Without processes: a fake node whose later spawns never answer; the wait is made short.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from support.ok_replica import OkReplica
from troupe.runtime.errors import StageFailed
from troupe.runtime.pipeline import hook_calls
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.hosts import EngineHosts
from troupe.runtime.placement import Host

pytestmark = pytest.mark.anyio

WAIT_S = 30  # bound on the whole run; never an upper bound on speed


class _Finalizing(OkReplica):
    """A stage with a finalize hook."""

    async def ask(self, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "stage_info":
            return {"hooks": ["finalize"]}
        if kind == "stage_finalize":
            return {}
        return await super().ask(kind, payload, timeout)


class _SlowLinkNode:
    """Answers the first ``answered`` spawns; the later ones never (the link went slow)."""

    def __init__(self, answered: int) -> None:
        self.answered = answered
        self.spawns: list[str] = []

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "spawn_worker":
            self.spawns.append(payload["name"])
            if len(self.spawns) > self.answered:
                await anyio.sleep_forever()
        return {}

    def ref(self, path: str) -> Any:
        return _Finalizing()


@pytest.fixture(autouse=True)
def short_wait(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(hook_calls, "STARTED_S", 0.05)
    yield


def _engine(node: _SlowLinkNode, **kwargs: Any) -> PipelineEngine:
    cfg = PipelineConfig.model_validate(
        {
            "name": "p",
            "items": 3,
            "scale_interval_s": 3600.0,
            "stages": [{"name": "store", "actor": "m:Stage"}],
        }
    )
    hosts = EngineHosts([Host("n1", "tcp://n1:1")])
    return PipelineEngine(cfg, node, "tcp://n1:1", hosts=hosts, **kwargs)  # type: ignore[arg-type]


async def test_a_finalize_whose_replica_never_starts_ends_the_run_in_one_line_that_says_rerun() -> None:
    node = _SlowLinkNode(answered=1)

    def give_back() -> None:  # the scaler gave the stage's replica back before its finalize
        engine.stages[0].replicas[0].retiring = True

    engine = _engine(node, out="/data/out-d", on_finishing=give_back)
    with anyio.fail_after(WAIT_S), pytest.raises(StageFailed) as caught:
        await engine.run()
    said = str(caught.value)
    assert said.startswith("stage store: no replica started within 0.05 s to run its finalize hook")
    assert "(one was still starting on node n1: the link from this host to it may be slow or down" in said
    assert said.endswith(
        "every item has its outcome, and the finalize hook did not run: the same command run again "
        "into the same --out (/data/out-d) finalises what they committed (nothing is lost)"
    )
    assert node.spawns == ["p-store-0", "p-store-1"]


async def test_a_first_replica_that_never_starts_ends_the_run_in_one_line() -> None:
    node = _SlowLinkNode(answered=0)
    with anyio.fail_after(WAIT_S), pytest.raises(StageFailed) as caught:
        await _engine(node).run()
    said = str(caught.value)
    assert said.startswith("stage store: no replica started within 0.05 s (one was still starting on node n1")
    assert said.endswith("no item moved: run the same command again (what earlier runs committed is kept)")
