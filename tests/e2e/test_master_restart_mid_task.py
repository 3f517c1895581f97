"""A real master restarted (SIGTERM, SIGKILL) while its workers run tasks: no task runs again.

README "Upgrading a cluster" step 2 restarts the master on its journal while the nodes work on.
Before report mt 6 was fixed, the restarted master voided every lease: the holders' renewals were
refused, each running task was cancelled and run again from zero. Here a real node's two workers
each run one task, held by a gate file, while the master is stopped and started again on the
same journal and endpoint; the workers renew their leases with the new master, register again
though busy, and once the gate opens each task has started once and committed once.

Real processes on loopback, in ``$TROUPE_TEST_PORTS`` where the machine gives one.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from support.chaos import TaskMaster, node_config, start_master
from support.counted_starts import starts
from support.port_range import test_endpoint
from troupe.runtime.errors import ActorStopped, AskTimeout, Unreachable
from troupe.runtime.testing.plugin import import_path, node_start_command, reap

pytestmark = pytest.mark.e2e

TESTS = Path(__file__).resolve().parents[1]
TASK = "support.counted_starts:CountedSleepTask"
LEASE_S = 6.0  # renewed every 2 s: a refused renewal would stop a copy long before the gate opens


class Cluster:
    """A master and one node of two task workers; every process is reaped at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.master: TaskMaster | None = None
        self.node: subprocess.Popen[bytes] | None = None
        self.children: list[psutil.Process] = []

    def start(self) -> TaskMaster:
        self.master = start_master(self.tmp / "m", endpoint=test_endpoint())
        config = self.tmp / "n1.toml"
        config.write_text(node_config(self.master, ["w1", "w2"], TASK, ""))
        command = node_start_command(config, "n1", test_endpoint(), self.tmp / "logs")
        env = {**os.environ, "PYTHONPATH": import_path(TESTS)}
        self.node = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        return self.master

    def restart_master(self, sig: signal.Signals) -> TaskMaster:
        assert self.master is not None
        self.master.proc.send_signal(sig)
        self.master.proc.wait(timeout=30)
        self.master = start_master(self.tmp / "m", endpoint=self.master.endpoint)
        return self.master

    def reap(self) -> None:
        if self.node is not None:
            try:
                self.children = psutil.Process(self.node.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
            assert reap(self.node, self.children) == []
        if self.master is not None:
            assert self.master.reap() == []


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.reap()


async def _holding(master: TaskMaster) -> dict[str, int]:
    """The leases the master counts per registered worker; {} while it does not answer."""
    try:
        workers = (await master.call("status", timeout=5.0))["workers"]
    except (Unreachable, ActorStopped, AskTimeout):
        return {}
    return {w["worker_id"]: int(w["used"]) for w in workers}


async def _until_holding(master: TaskMaster, timeout: float = 60.0) -> None:
    """Poll (bounded) until each of the two workers holds one lease at the master."""
    with anyio.fail_after(timeout):
        while await _holding(master) != {"n1/w1": 1, "n1/w2": 1}:
            await anyio.sleep(0.1)


async def _until_started(outputs: Path, timeout: float = 60.0) -> None:
    """Poll (bounded) until each task has started: the lease arrives a moment before."""
    with anyio.fail_after(timeout):
        while starts(outputs) != {"r-000000": 1, "r-000001": 1}:
            await anyio.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_master_restarted_mid_task_runs_no_task_again(cluster: Cluster, sig: signal.Signals) -> None:
    master = cluster.start()
    anyio.run(master.wait_workers, {"n1/w1", "n1/w2"})
    gate = cluster.tmp / "gate"
    params: dict[str, Any] = {"min_ms": 0, "max_ms": 0, "wait_for": str(gate)}
    submit = partial(master.submit, "r", "sleep", 2, params, lease_s=LEASE_S, max_attempts=3)
    job = anyio.run(submit)
    anyio.run(_until_holding, master)
    anyio.run(_until_started, master.outputs)

    master = cluster.restart_master(sig)
    # Both renew their leases with the new master, and register again though busy.
    anyio.run(_until_holding, master)
    gate.touch()
    view = anyio.run(master.wait_job, job, 60.0)
    master.check_exactly_once(view, "r-", 2)
    assert starts(master.outputs) == {"r-000000": 1, "r-000001": 1}  # none ran again
    status = anyio.run(master.call, "status")
    assert "renew_rejected" not in status["stale_reports"], status["stale_reports"]
    assert [r["attempt"] for r in master.results("r-")] == [1, 1]
