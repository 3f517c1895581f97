"""A pipeline run on a cluster that is cancelled mid-run (Ctrl-C) leaves nothing behind: the
nodes outlive the run, so the run stops its replicas there itself, and it gives the master back
the leases it held, so that a rerun takes those items at once instead of after their leases
expire (minutes). The rerun starts replicas under the same names while the cancelled ones may
still be stopping: the node waits for them to exit.

Two nodes on loopback (127.0.0.2, 127.0.0.3) joined to a test's master; the last stage waits at
a gate (a file) so that items are held when the run is cancelled. Every process is reaped by
its pid, the nodes' workers too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.chaos import TaskMaster
from support.gated_pipeline import gated_config, running_replicas
from support.hook_stages import read_records
from support.tagged_nodes import tagged_nodes
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.runner import run_pipeline
from troupe.runtime.testing.plugin import import_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NODES = {"na": ("127.0.0.2", "store"), "nb": ("127.0.0.3", "plain")}
ITEMS = 6
RUN_TIMEOUT_S = 240
SUPPORT = "support.direct_plane_stages"
STOPPED_WAIT_S = 60  # a bound on the stop of a cancelled run's replicas
LEASED_WAIT_S = 30  # a bound on the poll for the given-back leases (they would hold for 120 s)


@pytest.fixture
def two_nodes(tmp_path: Path, master: TaskMaster) -> Iterator[TaskMaster]:
    with tagged_nodes(master, tmp_path, NODES, env={"PYTHONPATH": import_path()}):
        yield master


async def _leased(master: TaskMaster) -> int:
    jobs = {j["job_id"]: j for j in await master.call("jobs")}
    counts: dict[str, Any] = jobs["cancelled"]["counts"]
    return int(counts.get("leased", 0))


def test_a_cancelled_run_stops_its_replicas_and_gives_its_leases_back(
    tmp_path: Path, two_nodes: TaskMaster
) -> None:
    log, gate = tmp_path / "seen.jsonl", tmp_path / "gate"
    cfg = gated_config("cancelled", ITEMS, log, gate)

    async def cancelled_mid_run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_pipeline(cfg, tmp_path / "out", cluster=two_nodes.endpoint, nodes=2))
            with anyio.fail_after(RUN_TIMEOUT_S):  # until an item waits at the gate: items are held
                while not any(r["stage"] == "wait" for r in read_records(log)):
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    anyio.run(cancelled_mid_run)
    assert anyio.run(running_replicas, two_nodes.endpoint, "cancelled", len(NODES)) == []

    async def leases_given_back() -> None:
        with anyio.fail_after(LEASED_WAIT_S):
            while await _leased(two_nodes):
                await anyio.sleep(0.1)

    anyio.run(leases_given_back)

    async def off_the_list() -> None:  # ctl status listed a stopped run until the job's next run
        with anyio.fail_after(LEASED_WAIT_S):
            while any(
                "cancelled" in (w.get("kinds") or []) for w in (await two_nodes.call("status"))["workers"]
            ):
                await anyio.sleep(0.1)

    anyio.run(off_the_list)

    gate.touch()  # the rerun's items pass; its replicas take the names of the cancelled ones

    async def rerun() -> Any:
        with anyio.fail_after(RUN_TIMEOUT_S):
            return await run_pipeline(cfg, tmp_path / "out", cluster=two_nodes.endpoint, nodes=2)

    result = anyio.run(rerun)
    assert result.counts()["dead"] == 0, result.errors
    checked = {r["task_id"] for r in read_records(log) if r["stage"] == "check"}
    assert checked == {f"cancelled-{i:06d}" for i in range(ITEMS)}
    assert anyio.run(running_replicas, two_nodes.endpoint, "cancelled", len(NODES)) == []


def test_a_run_cancelled_while_a_replica_starts_leaves_no_worker(
    tmp_path: Path, two_nodes: TaskMaster
) -> None:
    """Cancelled while a node still starts a replica: the run had waited, shielded, for the
    node's answer, which its cancelled runtime no longer read; after 130 s it gave up and left
    the replica running on the node for good. Now the run ends at once and tells the node to
    stop it, which the node does once the worker has started."""
    log, gate = tmp_path / "seen.jsonl", tmp_path / "gate"
    kwargs = {"nbytes": 1024, "log": str(log), "gate": str(gate)}
    cfg = PipelineConfig.model_validate(
        {
            "name": "unstarted",
            "items": ITEMS,
            "stages": [{"name": "slow", "actor": f"{SUPPORT}:SlowToStart", "kwargs": kwargs}],
        }
    )

    async def run() -> None:
        await run_pipeline(cfg, tmp_path / "out", cluster=two_nodes.endpoint, nodes=2)

    async def cancelled_while_starting() -> None:
        with anyio.fail_after(RUN_TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                while not any(r["stage"] == "starting" for r in read_records(log)):
                    await anyio.sleep(0.05)  # until the replica's worker runs its started hook
                tg.cancel_scope.cancel()
                gate.touch()  # the worker may register now: it must be stopped all the same

    anyio.run(cancelled_while_starting)

    async def no_replica_left() -> None:
        with anyio.fail_after(STOPPED_WAIT_S):
            while await running_replicas(two_nodes.endpoint, "unstarted", len(NODES)):
                await anyio.sleep(0.2)

    anyio.run(no_replica_left)
