"""``troupe ctl undrain``: a drained node takes tasks again, its stopped workers started again.

A real node with the master inside (the plugin's ``troupe_cluster(..., master=True)``), driven
through the ``troupe`` command as an operator would.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from troupe.runtime import OutputStore
from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import Cluster

pytestmark = pytest.mark.e2e

troupe_cluster = troupe_testing.troupe_cluster  # also when the pytest11 entry point is not installed

CONFIG = """
[node]
stop_grace_s = 2

[[workers]]
name = "w1"
[[workers.actors]]
name = "task"
class = "troupe.actors.demo.tasks:SleepTask"
kwargs = {{ outputs = "{out}", durable = false }}
"""
JOB = '[job]\nname = "after-undrain"\nkind = "sleep"\ncount = 6\n'


def troupe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    """A bounded poll of another process's state."""
    with anyio.fail_after(timeout):
        while not await condition():
            await anyio.sleep(0.05)


async def master_workers(cluster: Cluster) -> list[dict[str, Any]]:
    workers: list[dict[str, Any]] = (await cluster.master_control("status"))["workers"]
    return workers


async def test_an_undrained_node_starts_its_workers_again_and_runs_a_job(
    troupe_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """drain stops the node's task worker; undrain starts it again and a new job runs on it."""
    out = tmp_path / "out"
    cluster = troupe_cluster(CONFIG.format(out=out), "n1", master=True)
    master = cluster.master_endpoint
    assert master is not None

    async def joined() -> bool:
        return [w["worker_id"] for w in await master_workers(cluster)] == ["n1/w1"]

    await until(joined)
    drained = troupe("ctl", "drain", "n1", "--master", master)
    assert drained.returncode == 0, drained.stderr
    assert "undrain" in drained.stdout

    async def stopped() -> bool:
        return (await cluster.worker("w1"))["state"] == "stopped"

    await until(stopped)
    resumed = troupe("ctl", "undrain", "n1", "--master", master)
    assert resumed.returncode == 0, resumed.stderr
    assert "takes tasks again" in resumed.stdout and "w1" in resumed.stdout

    job = await cluster.run_job(JOB)
    assert job["state"] == "done" and job["counts"]["done"] == 6
    assert len(OutputStore(out).committed()) == 6
    assert (await cluster.worker("w1"))["state"] == "running"


async def test_undrain_of_an_unknown_node_names_it_and_exits_1(
    troupe_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """An operator's typo is one line naming the node, exit status 1."""
    cluster = troupe_cluster(CONFIG.format(out=tmp_path / "out"), "n1", master=True)
    assert cluster.master_endpoint is not None
    done = troupe("ctl", "undrain", "nope", "--master", cluster.master_endpoint)
    assert done.returncode == 1
    assert "no node 'nope' has joined master" in done.stderr


async def test_a_drain_leaves_the_workers_a_requester_owns_and_undrain_starts_only_its_own(
    troupe_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """A pipeline's replicas (workers started for an owner) run on through a drain, as the
    README says; they were stopped, their calls failing, and an undrain started them again
    after their run had ended, with nothing left to stop them."""
    cluster = troupe_cluster(CONFIG.format(out=tmp_path / "out"), "n1", master=True)
    master = cluster.master_endpoint
    assert master is not None

    async def joined() -> bool:
        return [w["worker_id"] for w in await master_workers(cluster)] == ["n1/w1"]

    await until(joined)
    async with cluster.client() as owner:  # a run's engine: it answers the node's pings
        replica = {
            "name": "run-stage-0",
            "actors": [{"name": "echo", "class": "troupe.actors.demo.actors:Echo"}],
            "owner": owner.address,
            "timeout_s": 30.0,
        }
        await owner.control(cluster.endpoint, "spawn_worker", replica, timeout=40.0)
        drained = troupe("ctl", "drain", "n1", "--master", master)
        assert drained.returncode == 0, drained.stderr

        async def own_worker_stopped() -> bool:
            return (await cluster.worker("w1"))["state"] == "stopped"

        await until(own_worker_stopped)
        assert (await cluster.worker("run-stage-0"))["state"] == "running"
        resumed = troupe("ctl", "undrain", "n1", "--master", master)
        assert resumed.returncode == 0, resumed.stderr
        assert "w1" in resumed.stdout and "run-stage-0" not in resumed.stdout, resumed.stdout
