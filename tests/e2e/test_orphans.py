"""No orphans: whatever a node's children are doing, they die with it (DESIGN.md invariant 6).

Real nodes, workers and supervisors on loopback. A node is SIGKILLed while one worker is
stalled (its event loop blocked on a lock) and one is hung in a C call holding the GIL: neither
can act on a catchable signal, and both must still be gone within a bounded wait. A node that
starts where a predecessor died reaps what that predecessor recorded, and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import psutil
import pytest

from troupe.runtime import AskTimeout
from troupe.runtime.node.leftovers import pids_file
from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import Cluster

pytestmark = pytest.mark.e2e

# The plugin's fixture, also when the `troupe` pytest11 entry point is not installed.
troupe_cluster = troupe_testing.troupe_cluster

GONE_WITHIN_S = 15.0  # a bound on a poll of the kernel's process table, not on speed

# Supervision that never steps in: the stuck workers must be left to the node's death.
PATIENT = """
[node]
stop_grace_s = 2

[supervision]
interval_s = 0.1
heartbeat_timeout_s = 120
progress_timeout_s = 120
"""

STUCK = (
    PATIENT
    + """
[[workers]]
name = "w-stall"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]

[[workers]]
name = "w-hang"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]

[[workers]]
name = "w-idle"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]
"""
)

ONE = (
    PATIENT
    + """
[[workers]]
name = "w-one"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]
"""
)


def _alive(pid: int, create_time: float) -> bool:
    """The very process (pid and start time) still runs; a zombie is dead."""
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == create_time and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(procs: dict[int, float], timeout: float = GONE_WITHIN_S) -> dict[int, float]:
    """Poll until none of ``procs`` (pid -> start time) runs; return those still running."""
    deadline = time.monotonic() + timeout
    left = dict(procs)
    while left and time.monotonic() < deadline:
        left = {pid: t for pid, t in left.items() if _alive(pid, t)}
        if left:
            time.sleep(0.05)
    return left


def _kill_if_alive(procs: dict[int, float]) -> None:
    for pid, t in procs.items():
        if _alive(pid, t):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def stray() -> Iterator[dict[int, float]]:
    """Processes a test expects to die; any that did not are SIGKILLed at teardown."""
    procs: dict[int, float] = {}
    yield procs
    _kill_if_alive(procs)


async def _stuck(cluster: Cluster, worker: str) -> None:
    """Poll until ``worker``'s event loop no longer answers a ping (bounded)."""
    endpoint = (await cluster.worker(worker))["endpoint"]
    with anyio.fail_after(30):
        async with cluster.client() as rt:
            while True:
                try:
                    await rt.control(endpoint, "ping", timeout=0.5)
                except AskTimeout:
                    return
                await anyio.sleep(0.05)


async def test_a_sigkilled_node_takes_stalled_and_hung_workers_and_its_supervisor_with_it(
    troupe_cluster: Callable[..., Cluster], stray: dict[int, float]
) -> None:
    """SIGKILL of a node whose workers are stalled, hung with the GIL, or idle: every worker and the
    supervisor are gone."""
    cluster = troupe_cluster(STUCK)
    await cluster.chaos("stall", "w-stall")
    await cluster.chaos("hang_with_gil", "w-hang", seconds=120)
    async with cluster.client() as rt:  # open while waiting: closing drops an unsent tell
        await rt.ref("w-stall/echo").tell("echo", "stall")
        await rt.ref("w-hang/echo").tell("echo", "hang")
        await _stuck(cluster, "w-stall")
        await _stuck(cluster, "w-hang")
    status = await cluster.supervision()
    children = {p.pid: p.create_time() for p in cluster.descendants()}
    stray.update(children)
    expected = {w["pid"] for w in status["workers"]} | {status["supervision"]["supervisor_pid"]}
    assert expected <= set(children), (expected, children)
    record = json.loads(pids_file(cluster.log_dir, cluster.name, cluster.proc.pid).read_text())
    assert expected <= {c["pid"] for c in record["children"]}  # what a successor would reap

    cluster.proc.send_signal(signal.SIGKILL)
    cluster.proc.wait(timeout=30)

    survivors = _wait_gone(children)
    assert not survivors, f"outlived their SIGKILLed node: {survivors}"


async def test_a_restarted_node_reaps_what_a_dead_predecessor_left_and_nothing_else(
    tmp_path: Path, troupe_cluster: Callable[..., Cluster], stray: dict[int, float]
) -> None:
    """A recorded process of a dead predecessor is SIGKILLed at start; a reused pid (other start time) is left
    alone."""
    log_dir = tmp_path / "t" / "logs"  # where troupe_cluster(..., "t") puts the node's logs
    log_dir.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(2)]
    try:
        left, reused = (psutil.Process(p.pid) for p in sleepers)
        stray.update({left.pid: left.create_time(), reused.pid: reused.create_time()})
        record = {
            "node": "t",
            "owner": {"pid": dead.pid, "create_time": 1.0},
            "children": [
                {"pid": left.pid, "create_time": left.create_time(), "role": "worker w-old"},
                {"pid": reused.pid, "create_time": reused.create_time() - 50.0, "role": "worker w-gone"},
            ],
        }
        predecessor = pids_file(log_dir, "t", dead.pid)
        predecessor.write_text(json.dumps(record))

        cluster = troupe_cluster(ONE, "t")  # reaping comes before its workers start

        assert sleepers[0].wait(timeout=GONE_WITHIN_S) == -signal.SIGKILL
        assert sleepers[1].poll() is None, "a process whose start time does not match was killed"
        assert not predecessor.exists()
        lines = [json.loads(ln) for ln in (log_dir / "t.jsonl").read_text().splitlines()]
        reaped = [ln for ln in lines if ln["event"] == "leftover_reaped"]
        assert [(ln["leftover_pid"], ln["pid"]) for ln in reaped] == [(left.pid, cluster.proc.pid)]
    finally:
        for p in sleepers:
            p.kill()
            p.wait(timeout=30)


def test_a_child_whose_parent_death_signal_did_not_fire_still_dies(stray: dict[int, float]) -> None:
    """The parent watchdog: with the parent-death signal cleared, a child still dies once its node is gone."""
    child_code = textwrap.dedent(
        """
        import ctypes, time
        from troupe.runtime.node.child import die_with_parent
        die_with_parent()
        ctypes.CDLL(None).prctl(1, 0)  # as if the parent-death signal never fired
        print("ready", flush=True)
        time.sleep(120)
        """
    )
    node_code = textwrap.dedent(
        f"""
        import os, subprocess, sys
        from troupe.runtime.node.child import child_env
        child = subprocess.Popen([sys.executable, "-c", {child_code!r}], env=child_env({{}}),
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "ready\\n"
        print(child.pid, flush=True)
        os._exit(0)  # dies without reaping or signalling its child
        """
    )
    with subprocess.Popen([sys.executable, "-c", node_code], stdout=subprocess.PIPE, text=True) as node:
        try:
            assert node.stdout is not None
            pid = int(node.stdout.readline())
            try:
                stray[pid] = psutil.Process(pid).create_time()
            except psutil.NoSuchProcess:
                pass  # gone already
        finally:
            node.wait(timeout=30)
    assert not _wait_gone(dict(stray)), "the child outlived its parent"


ORPHAN_MAKER = (
    PATIENT
    + """
[[workers]]
name = "w-orph"
actors = [{ name = "maker", class = "support.orphan_maker:OrphanMaker" }]
"""
)


async def test_a_process_a_dead_worker_left_behind_is_reaped_when_it_exits(
    troupe_cluster: Callable[..., Cluster], stray: dict[int, float], tmp_path: Path
) -> None:
    """The node adopts (as a child subreaper) what a SIGKILLed worker had started outside its
    process group (what stays in it is killed with the worker: test_stop_kills_descendants.py);
    once that process exits, the node reaps it: no zombie stays in the process table."""
    cluster = troupe_cluster(ORPHAN_MAKER)
    gate = tmp_path / "orphan-may-exit"
    async with cluster.client() as rt:
        orphan = await rt.ref("w-orph/maker").ask("spawn", str(gate), timeout=30)
    stray[orphan] = psutil.Process(orphan).create_time()
    worker = (await cluster.worker("w-orph"))["pid"]
    os.kill(worker, signal.SIGKILL)
    with anyio.fail_after(GONE_WITHIN_S):  # adopted by the node once its worker is gone
        while psutil.Process(orphan).ppid() != cluster.proc.pid:
            await anyio.sleep(0.05)
    gate.touch()  # only now, adopted: it exits, then is reaped
    with anyio.fail_after(GONE_WITHIN_S):
        while psutil.pid_exists(orphan):
            await anyio.sleep(0.1)
