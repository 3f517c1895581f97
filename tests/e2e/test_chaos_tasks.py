"""Faults injected into workers that serve tasks: detected, killed where they must be, no task lost.

Every test runs a real master and a real node (supervisor and task workers) on loopback, and
counts commits in the shared OutputStore: a job ends with every task committed exactly once
and nothing dead-lettered (DESIGN.md invariants 1 and 2). Detection bounds (invariant 5) are
the supervisor's own measure of the silence it acted on, with a margin of two seconds over
"timeout plus one beat" for a loaded two-core CI machine; no test bounds how fast a job runs.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from support.chaos import TaskMaster, node_config
from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import ChaosEvent, Cluster, random_schedule

pytestmark = pytest.mark.e2e

# The plugin's fixture, also when the `troupe` pytest11 entry point is not installed.
troupe_cluster = troupe_testing.troupe_cluster

INTERVAL_S, TIMEOUT_S, PROGRESS_S = 0.1, 0.6, 1.0
TABLES = f"""
[supervision]
interval_s = {INTERVAL_S}
heartbeat_timeout_s = {TIMEOUT_S}
progress_timeout_s = {PROGRESS_S}
startup_timeout_s = 3

[restart]
max_restarts = 100
period_s = 60
backoff_base_s = 0.05
backoff_max_s = 0.2
"""
SLEEP = "troupe.actors.demo.tasks:SleepTask"
CRUNCH = "support.chaos_tasks:CrunchTask"
NODE = "n1"
TASKS = 40
PARAMS = {"min_ms": 20, "max_ms": 50}
LEASE_S = 3600.0  # beyond every wait here: a dead worker's task that came back only at lease
# expiry would fail the wait for its job (it must come back at once, with the worker's exit)
SHORT_LEASE_S = 2.0  # a lost lease (drop, partition) comes back only when it expires
POLICY = {"lease_s": LEASE_S, "max_attempts": 10, "backoff_base_s": 0}
HOLD_S = 0.8  # a slow fault that keeps w1 inside a task while it is killed (< PROGRESS_S)


async def _serving(
    master: TaskMaster, start: Callable[..., Cluster], workers: list[str], actor: str = SLEEP
) -> Cluster:
    cluster = start(node_config(master, workers, actor, TABLES), NODE)
    await master.wait_workers({f"{NODE}/{w}" for w in workers})
    await cluster.wait_for(_beating)
    return cluster


def _beating(status: dict[str, Any]) -> bool:
    """Every worker's beats reach the supervisor (until the first one, the startup grace applies)."""
    watched = (status["supervision"].get("supervisor") or {}).get("workers", {})
    return all(watched.get(w["name"], {}).get("state") is not None for w in status["workers"])


async def _until(condition: Callable[[], Awaitable[Any]], timeout: float = 15.0) -> None:
    """A bounded poll of an async condition."""
    with anyio.fail_after(timeout):
        while not await condition():
            await anyio.sleep(0.01)


async def _restarted(cluster: Cluster, worker: str, old_pid: int) -> dict[str, Any]:
    def done(status: dict[str, Any]) -> bool:
        w = Cluster.worker_in(status, worker)
        return w["state"] == "running" and w["pid"] != old_pid

    return Cluster.worker_in(await cluster.wait_for(done, timeout=20), worker)


async def _kill_record(cluster: Cluster, worker: str) -> dict[str, Any]:
    """Wait for the supervisor's kill of ``worker``; return its report (``silent_s`` is its own measure)."""
    status = await cluster.wait_for(lambda s: worker in s["supervision"]["kills"], timeout=15)
    kill: dict[str, Any] = status["supervision"]["kills"][worker]
    return kill


def _retried(master: TaskMaster, prefix: str) -> list[dict[str, Any]]:
    return [r for r in master.results(prefix) if r["attempt"] >= 2]


async def _unharmed(cluster: Cluster, worker: str, pid: int) -> None:
    status = await cluster.supervision()
    w = Cluster.worker_in(status, worker)
    assert (w["pid"], w["restarts"], w["state"]) == (pid, 0, "running")
    assert worker not in status["supervision"]["kills"]


async def test_kill_is_reaped_at_once_and_the_held_task_requeued_at_once(
    master: TaskMaster, troupe_cluster: Any
) -> None:
    """A worker SIGKILLed while it holds a lease is seen by waitpid, restarted, and its task redone long
    before the lease ends."""
    cluster = await _serving(master, troupe_cluster, ["w1", "w2"])
    before = await cluster.worker("w1")
    await cluster.chaos("slow", "w1", seconds=HOLD_S, count=1)  # holds w1 inside its first task
    job_id = await master.submit("kill", "sleep", TASKS, PARAMS, **POLICY)
    await _until(lambda: master.used(f"{NODE}/w1"))
    await cluster.chaos("kill", "w1")
    after = await _restarted(cluster, "w1", before["pid"])
    job = await master.wait_job(job_id, 60)
    master.check_exactly_once(job, "kill-", TASKS)
    # Seen by waitpid, not by a missed heartbeat: the exit carries the kill, not no_heartbeat.
    assert after["exit"].startswith("chaos_kill") and "SIGKILL" in after["exit"]
    assert after["restarts"] == 1
    assert _retried(master, "kill-"), "the task w1 held was not run again"


async def test_crash_fails_the_attempt_and_the_task_is_retried(
    master: TaskMaster, troupe_cluster: Any
) -> None:
    """A crash raised in the task path fails that attempt only: the worker lives on and the task is retried
    once more."""
    cluster = await _serving(master, troupe_cluster, ["w1", "w2"])
    before = await cluster.worker("w1")
    await cluster.chaos("crash", "w1", count=2)
    job = await master.wait_job(await master.submit("crash", "sleep", TASKS, PARAMS, **POLICY), 60)
    master.check_exactly_once(job, "crash-", TASKS)
    healed = await cluster.heal("w1")
    assert healed["workers"]["w1"]["fired"] == {"crash": 2}
    assert _retried(master, "crash-")
    await _unharmed(cluster, "w1", before["pid"])


async def test_hang_with_gil_is_killed_by_the_heartbeat_timeout(
    master: TaskMaster, troupe_cluster: Any
) -> None:
    """A task stuck in a C call holding the GIL stops the beats: killed for no heartbeat, not before
    its timeout (how soon after, on a virtual clock: test_liveness.py), its task redone."""
    cluster = await _serving(master, troupe_cluster, ["w1", "w2"])
    before = await cluster.worker("w1")
    await cluster.chaos("hang_with_gil", "w1", seconds=30, count=1)
    job_id = await master.submit("hang", "sleep", TASKS, PARAMS, **POLICY)
    kill = await _kill_record(cluster, "w1")
    assert kill["reason"] == "no_heartbeat" and kill["pid"] == before["pid"]
    assert kill["silent_s"] >= TIMEOUT_S  # how soon after: on a virtual clock, test_liveness.py
    after = await _restarted(cluster, "w1", before["pid"])
    assert after["exit"].startswith("no_heartbeat")
    master.check_exactly_once(await master.wait_job(job_id, 60), "hang-", TASKS)
    assert _retried(master, "hang-")


async def test_stall_is_killed_by_the_progress_timeout(master: TaskMaster, troupe_cluster: Any) -> None:
    """A task blocked on a lock keeps beating but shows no progress: killed for no progress, not
    before its timeout (how soon after, on a virtual clock: test_liveness.py), its task redone."""
    cluster = await _serving(master, troupe_cluster, ["w1", "w2"])
    before = await cluster.worker("w1")
    await cluster.chaos("stall", "w1", count=1)
    job_id = await master.submit("stall", "sleep", TASKS, PARAMS, **POLICY)
    kill = await _kill_record(cluster, "w1")
    assert kill["reason"] == "no_progress" and kill["pid"] == before["pid"]
    assert kill["last_status"]["state"] == "busy" and kill["last_status"]["current"] == "task/sleep"
    assert kill["silent_s"] >= PROGRESS_S  # how soon after: on a virtual clock, test_liveness.py
    after = await _restarted(cluster, "w1", before["pid"])
    assert after["exit"].startswith("no_progress")
    master.check_exactly_once(await master.wait_job(job_id, 60), "stall-", TASKS)
    assert _retried(master, "stall-")


async def test_slow_tasks_are_not_killed(master: TaskMaster, troupe_cluster: Any) -> None:
    """Tasks delayed below the progress timeout finish on their first attempt; the worker is never killed."""
    cluster = await _serving(master, troupe_cluster, ["w1", "w2"])
    before = await cluster.worker("w1")
    await cluster.chaos("slow", "w1", seconds=0.2 * PROGRESS_S, count=3)  # 5x under the limit
    job = await master.wait_job(await master.submit("slow", "sleep", TASKS, PARAMS, **POLICY), 60)
    master.check_exactly_once(job, "slow-", TASKS)
    healed = await cluster.heal("w1")
    assert healed["workers"]["w1"]["fired"] == {"slow": 3}
    assert not _retried(master, "slow-")
    await _unharmed(cluster, "w1", before["pid"])


async def test_a_dropped_task_comes_back_when_its_lease_expires(
    master: TaskMaster, troupe_cluster: Any
) -> None:
    """A dropped task is neither run nor reported; its lease expires and it is done once elsewhere or
    later."""
    cluster = await _serving(master, troupe_cluster, ["w1", "w2"])
    before = await cluster.worker("w1")
    await cluster.chaos("drop", "w1", count=1)
    t0 = time.monotonic()
    job_id = await master.submit("drop", "sleep", TASKS, PARAMS, **{**POLICY, "lease_s": SHORT_LEASE_S})
    job = await master.wait_job(job_id, 60)
    master.check_exactly_once(job, "drop-", TASKS)
    assert time.monotonic() - t0 >= SHORT_LEASE_S  # the dropped lease had to expire first
    healed = await cluster.heal("w1")
    assert healed["workers"]["w1"]["fired"] == {"drop": 1}
    assert _retried(master, "drop-")
    await _unharmed(cluster, "w1", before["pid"])


async def test_a_worker_cut_off_from_the_master_loses_its_lease_not_the_task(
    master: TaskMaster, troupe_cluster: Any
) -> None:
    """A worker partitioned from the master mid-job is not killed; its lease expires and its task is done once
    elsewhere."""
    cluster = await _serving(master, troupe_cluster, ["w1", "w2"])
    before = await cluster.worker("w1")
    job_id = await master.submit("cut", "sleep", 60, PARAMS, **{**POLICY, "lease_s": SHORT_LEASE_S})
    await _until(lambda: master.used(f"{NODE}/w1"))
    reply = await cluster.chaos("partition", "w1", peers=[master.endpoint])
    t0 = time.monotonic()
    assert reply["workers"]["w1"]["partitioned_peers"] == [master.endpoint]
    job = await master.wait_job(job_id, 60)
    # w1 held a lease (or was being sent one) when cut off: the job waited for it to expire.
    assert time.monotonic() - t0 >= SHORT_LEASE_S - 0.5
    healed = await cluster.heal("w1")
    assert sum(healed["workers"]["w1"]["refused"].values()) >= 1
    master.check_exactly_once(job, "cut-", 60)
    await _unharmed(cluster, "w1", before["pid"])


async def test_a_long_task_that_reports_progress_is_not_killed(
    master: TaskMaster, troupe_cluster: Any
) -> None:
    """Pure-Python task work longer than the progress timeout survives when it calls progress(); a quiet
    attempt is killed and redone."""
    cluster = await _serving(master, troupe_cluster, ["w1"], CRUNCH)
    before = await cluster.worker("w1")
    params = {"seconds": 2.5 * PROGRESS_S}
    job = await master.wait_job(await master.submit("crunch", "crunch", 1, params), 60)
    master.check_exactly_once(job, "crunch-", 1)
    (result,) = master.results("crunch-")
    assert (result["attempt"], result["pid"], result["quiet"]) == (1, before["pid"], False)
    await _unharmed(cluster, "w1", before["pid"])
    # The contrast: the same work without progress() on its first attempt is a livelock.
    job_id = await master.submit("quiet", "crunch", 1, {**params, "quiet_attempts": 1})
    kill = await _kill_record(cluster, "w1")
    assert kill["reason"] == "no_progress" and kill["last_status"]["current"] == "task/crunch"
    master.check_exactly_once(await master.wait_job(job_id, 60), "quiet-", 1)
    (result,) = master.results("quiet-")
    assert result["attempt"] == 2 and result["pid"] != before["pid"]


SOAK_KINDS = ("kill", "crash", "hang_with_gil", "stall", "slow", "drop", "partition")
SOAK_WORKERS = ["w1", "w2", "w3"]
SOAK_TASKS, SOAK_S, SOAK_EVERY_S, SOAK_SEED = 300, 30.0, 1.0, 4
SOAK_HEAL_AFTER_S = 1.5  # a partition lasts this long


def _soak_schedule(master: TaskMaster) -> list[ChaosEvent]:
    options = {
        "crash": {"count": 1},
        "hang_with_gil": {"seconds": 30, "count": 1},
        "stall": {"count": 1},
        "slow": {"seconds": 0.2, "count": 2},
        "drop": {"count": 1},
        "partition": {"peers": [master.endpoint]},
    }
    events = random_schedule(SOAK_KINDS, SOAK_WORKERS, SOAK_S, SOAK_EVERY_S, SOAK_SEED, options)
    heals = [
        ChaosEvent(e.at_s + SOAK_HEAL_AFTER_S, "heal", e.target) for e in events if e.kind == "partition"
    ]
    return events + heals


@pytest.mark.timeout(240)
async def test_chaos_soak_every_task_done_exactly_once(master: TaskMaster, troupe_cluster: Any) -> None:
    """Faults of every kind at random for 30 s under a 300-task load: every task is done exactly once, none
    dead."""
    cluster = await _serving(master, troupe_cluster, SOAK_WORKERS)
    events = _soak_schedule(master)
    assert {e.kind for e in events} >= set(SOAK_KINDS)  # the seed draws every kind
    # ~200 ms tasks keep the three workers busy for the whole schedule.
    job_id = await master.submit(
        "soak",
        "sleep",
        SOAK_TASKS,
        {"min_ms": 150, "max_ms": 350},
        lease_s=3,
        max_attempts=50,
        backoff_base_s=0,
    )
    async with cluster.scheduled(events) as done:
        with anyio.fail_after(SOAK_S + 30):
            while len(done) < len(events):
                await anyio.sleep(0.1)
    await cluster.heal("*")
    job = await master.wait_job(job_id, 120)
    master.check_exactly_once(job, "soak-", SOAK_TASKS)
    accepted = [e for e, reply in done if not isinstance(reply, Exception)]
    assert len(accepted) >= len(events) // 2, [(e.kind, e.target, r) for e, r in done]
    status = await cluster.wait_for(lambda s: all(w["state"] == "running" for w in s["workers"]), timeout=30)
    assert sum(w["restarts"] for w in status["workers"]) >= 1
    assert status["supervision"]["give_ups"] == 0
