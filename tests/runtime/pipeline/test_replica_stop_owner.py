"""A run's stop of a replica names the run's process (``owner_process``), so that one reaching
a node late cannot stop the replica of the same name a rerun started there
(tests/runtime/node/test_stop_owner.py has the node's side); a node that refuses the field
still gets the stop, without it. Without processes: fake nodes.
"""

from __future__ import annotations

from typing import Any

import anyio

from support.recording_node import RecordingNode, one_stage_engine
from troupe.runtime.errors import BadRequest
from troupe.runtime.pipeline.engine import PipelineResult
from troupe.runtime.process_identity import process_identity

HANG_GUARD_S = 60  # a bound on a hang, never on speed


class OlderNode(RecordingNode):
    """A node whose ``stop_worker`` refuses ``owner_process``, as a spec refuses a field it
    does not allow, and stops nothing then."""

    async def stop(self, payload: dict[str, Any], timeout: float | None) -> None:
        if "owner_process" in payload:
            raise BadRequest(
                "control 'stop_worker': field 'owner_process': Extra inputs are not permitted, "
                f"got {payload['owner_process']!r}"
            )


async def _run(node: RecordingNode) -> PipelineResult:
    with anyio.fail_after(HANG_GUARD_S):
        return await one_stage_engine(node).run()


async def test_a_run_s_stop_names_its_process() -> None:
    node = RecordingNode()
    result = await _run(node)
    assert result.counts()["ok"] == 4
    assert node.stops and all(s["owner_process"] == process_identity() for s in node.stops), node.stops
    assert node.stopped == [s["name"] for s in node.spawns]


async def test_a_node_that_refuses_the_stop_s_owner_process_is_stopped_without_it() -> None:
    node = OlderNode()
    result = await _run(node)
    assert result.counts()["ok"] == 4
    first, *rest = node.stops
    assert first["owner_process"] == process_identity()
    assert rest and all("owner_process" not in s for s in rest)  # asked again without it
    assert node.stopped == [s["name"] for s in node.spawns]
