"""Leases ahead (``GetterConfig.prefetch``): real getters and a real master, in memory.

A worker asks on its own only for the slots it has empty; the reply to each report may carry
up to ``prefetch`` more leases, which wait in the worker for a slot. These tests hold the
workers' tasks on events, so what each worker holds at a given moment is exact.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from structlog.testing import capture_logs

from support.memory_master import master_in_memory, until
from troupe.runtime.tasks.task_actor import LeasedTask

LEASE_S = 1.5  # renewed every 0.5 s: a loaded machine may run a renewal a second late


class Gate:
    """A runner whose first ``free`` tasks end at once; the rest wait for ``release``."""

    def __init__(self, free: int = 1) -> None:
        self.free = free
        self.release = anyio.Event()
        self.started: list[str] = []
        self.finished: Counter[str] = Counter()

    async def __call__(self, task: LeasedTask) -> str:
        self.started.append(task.task_id)
        if len(self.started) > self.free:
            await self.release.wait()
        await anyio.lowlevel.checkpoint()
        self.finished[task.task_id] += 1
        return f"out/{task.task_id}"


async def test_a_worker_with_prefetch_2_holds_at_most_3_leases_and_runs_one(tmp_path: Path) -> None:
    """One slot, two ahead: after its first report the worker holds three leases, runs one, and
    the master grants it no fourth, even when asked for more."""
    gate = Gate(free=1)
    async with master_in_memory(tmp_path) as m, m.worker("w1", gate, prefetch=2, prefetch_wait_s=60) as g:
        await m.submit("j", 8)
        await until(lambda: g.statistics().waiting == 2)
        assert g.statistics().running == 1 and len(gate.started) == 2
        assert await m.held("n1/w1") == 3
        # the book caps what it grants by slots + prefetch, whatever the worker asks for
        extra = await m.call("request_task", {"worker_id": "n1/w1", "free_slots": 5, "wait_s": 0})
        assert extra["leases"] == [] and await m.held("n1/w1") == 3
        gate.release.set()
        job = await m.call("wait_job", {"job_id": "j", "timeout_s": 30}, timeout=40)
    assert job["state"] == "done" and job["counts"]["done"] == 8
    assert sorted(gate.finished) == [f"j-{i:06d}" for i in range(8)] and set(gate.finished.values()) == {1}


async def test_a_lease_ahead_that_waits_too_long_goes_back_to_another_worker(tmp_path: Path) -> None:
    """w1's running task blocks; the lease waiting behind it is given back after
    ``prefetch_wait_s`` (no attempt counted) and the idle w2 runs it. The master logs the give-back
    at info: it is a lease ahead working as meant (a warning each time flooded `--level warning`)."""
    slow, fast = Gate(free=1), Gate(free=10)
    with capture_logs() as logs:
        attempts = await _one_given_back(tmp_path, slow, fast)
    assert attempts == 0  # giving a lease back is not a lost attempt
    levels = {
        e["log_level"] for e in logs if e["event"] == "prefetched_lease_given_back"
    }  # worker's, master's
    assert levels == {"info"}, logs


async def _one_given_back(tmp_path: Path, slow: Gate, fast: Gate) -> int:
    async with master_in_memory(tmp_path) as m, m.worker("w1", slow, prefetch=1, prefetch_wait_s=0.2) as g1:
        await m.submit("j", 3)
        # task 0 ran at once; its report brought tasks 1 (now running, blocked) and 2 (waiting)
        await until(lambda: g1.statistics().waiting == 1)
        async with m.worker("w2", fast, prefetch=0):
            await until(lambda: bool(fast.finished))
            assert g1.statistics().given_back == 1
            slow.release.set()
            job = await m.call("wait_job", {"job_id": "j", "timeout_s": 30}, timeout=40)
        attempts = m.master.book.task("j-000002").attempts
    assert job["state"] == "done" and job["counts"]["done"] == 3
    assert list(fast.finished) == ["j-000002"]
    assert sorted(slow.finished) == ["j-000000", "j-000001"]
    return attempts


async def test_a_worker_that_dies_holding_leases_ahead_loses_no_task(tmp_path: Path) -> None:
    """w1 leaves (its process died: the node tells the master) while it runs one task and holds
    two ahead: all three go back, w2 runs them, and every task completes exactly once. Only the
    running copy's loss counts as an attempt: the two ahead never started."""
    doomed, spare = Gate(free=1), Gate(free=100)
    async with master_in_memory(tmp_path) as m:
        async with m.worker("w1", doomed, prefetch=2, prefetch_wait_s=60) as g1:
            await m.submit("j", 6, max_attempts=3)
            await until(lambda: g1.statistics().waiting == 2)
            held = doomed.started[1:]  # the blocked running one
        # the runtime is gone with its tasks: what a dead worker process leaves behind
        assert await m.call("worker_left", {"worker_id": "n1/w1", "pid": 0, "reason": "killed"})
        async with m.worker("w2", spare, prefetch=2):
            job = await m.call("wait_job", {"job_id": "j", "timeout_s": 30}, timeout=40)
        attempts = {f"j-{i:06d}": m.master.book.task(f"j-{i:06d}").attempts for i in range(1, 4)}
    assert job["state"] == "done" and job["counts"]["done"] == 6
    done = doomed.finished + spare.finished
    assert sorted(done) == [f"j-{i:06d}" for i in range(6)] and set(done.values()) == {1}
    assert held == ["j-000001"] and spare.finished["j-000001"] == 1  # the killed copy, redone
    assert attempts == {"j-000001": 1, "j-000002": 0, "j-000003": 0}


async def test_one_renewal_covers_every_lease_held(tmp_path: Path) -> None:
    """Leases ahead are renewed with the running one, in one message: none expires while it
    waits longer than its lease, and each task runs once on its first attempt."""
    gate = Gate(free=1)
    payloads: list[dict[str, Any]] = []
    async with master_in_memory(tmp_path) as m:
        runtime = m.master.runtime
        assert runtime is not None
        renew = runtime.unregister_control("renew")

        async def recorded(payload: Any) -> Any:
            payloads.append(payload)
            return await renew(payload)

        runtime.register_control("renew", recorded)
        async with m.worker("w1", gate, prefetch=2, prefetch_wait_s=60) as g:
            await m.submit("r", 4, lease_s=LEASE_S)
            await until(lambda: g.statistics().waiting == 2)
            # renewals every ttl/3: four of them span more than a whole lease
            await until(lambda: sum(len(p.get("more", ())) == 2 for p in payloads) >= 4)
            gate.release.set()
            job = await m.call("wait_job", {"job_id": "r", "timeout_s": 30}, timeout=40)
        attempts = [m.master.book.task(f"r-{i:06d}").attempts for i in range(4)]
    assert job["state"] == "done" and set(gate.finished.values()) == {1} and len(gate.finished) == 4
    assert m.master.lease_expiries == 0 and attempts == [0, 0, 0, 0]  # nothing lost, nothing redone
    full = next(p for p in payloads if len(p.get("more", ())) == 2)
    ids = {full["lease_id"], *(lease for _, lease in full["more"])}
    assert len(ids) == 3  # the running lease and both waiting ones, in one message
