"""A pipeline's job cancelled at the master mid-run (``troupe ctl cancel``) stops its run: the
run had gone on with the items it held (their ends ignored by the master) and reported them ok,
so the master and the run disagreed on what was done. Now the run raises JobCancelled naming the
job, stops its replicas on the node, which outlives it, and the same run again finalises what
was committed without running anything more.

One node on loopback (127.0.0.2) joined to a test's master; the last stage waits at a gate (a
file) that never opens, so that items are held when the job is cancelled. Every process is
reaped by its pid, the node's workers too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from support.chaos import TaskMaster
from support.gated_pipeline import gated_config, running_replicas
from support.hook_stages import read_records
from support.tagged_nodes import tagged_nodes
from troupe.runtime.errors import JobCancelled
from troupe.runtime.pipeline.runner import RunStart, run_pipeline
from troupe.runtime.testing.plugin import import_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NODES = {"na": ("127.0.0.2", "plain")}
ITEMS = 6
RUN_TIMEOUT_S = 240


@pytest.fixture
def one_node(tmp_path: Path, master: TaskMaster) -> Iterator[TaskMaster]:
    with tagged_nodes(master, tmp_path, NODES, env={"PYTHONPATH": import_path()}):
        yield master


def test_a_job_cancelled_at_the_master_stops_its_run(tmp_path: Path, one_node: TaskMaster) -> None:
    log, gate = tmp_path / "seen.jsonl", tmp_path / "gate"  # the gate stays shut
    cfg = gated_config("called-off", ITEMS, log, gate)
    out = tmp_path / "out"
    raised: list[BaseException] = []

    async def cancelled_at_the_master() -> None:
        async def run() -> None:
            try:
                await run_pipeline(cfg, out, cluster=one_node.endpoint, nodes=1)
            except JobCancelled as exc:
                raised.append(exc)

        with anyio.fail_after(RUN_TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                while not any(r["stage"] == "wait" for r in read_records(log)):
                    await anyio.sleep(0.05)  # an item waits at the gate: the run holds leases
                await one_node.call("cancel", {"job_id": "called-off"})

    anyio.run(cancelled_at_the_master)
    assert len(raised) == 1, "the run went on after its job was cancelled"
    assert "'called-off' was cancelled" in str(raised[0])
    assert "troupe ctl cancel" in str(raised[0])
    assert anyio.run(running_replicas, one_node.endpoint, "called-off", len(NODES)) == []
    checked = {r["task_id"] for r in read_records(log) if r["stage"] == "check"}
    assert len(checked) < ITEMS  # the gate held them: the cancel, not the items' end, stopped it

    starts: list[RunStart] = []

    async def rerun() -> None:
        with anyio.fail_after(RUN_TIMEOUT_S):
            await run_pipeline(cfg, out, cluster=one_node.endpoint, nodes=1, on_start=starts.append)

    anyio.run(rerun)  # finalises, and runs nothing: the gate is still shut, and it returns
    assert [s.job_cancelled for s in starts] == [True]
    assert {r["task_id"] for r in read_records(log) if r["stage"] == "check"} == checked
    assert anyio.run(running_replicas, one_node.endpoint, "called-off", len(NODES)) == []
