"""A real getter and a real master (in memory): a reply lost on the way loses no time.

The worker's first reply that carries a lease is lost, as when its host's link is cut while
the master holds its request (the fake below lets the reply through to the master's side and
then tells the getter it timed out). Its next request names what it holds; the master sees the
lease never arrived and leases that task again at once: the job ends long before the lost
lease could expire, each task run once, no attempt counted for the lost lease. The same for
the leases a report's reply carries (its piggybacked request's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import AskTimeout
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"
LEASE_S = 600.0  # the lost lease would hold its task this long: the test ends long before


class LosesFirstLeases:
    """The worker's runtime, but the first reply to ``msg_type`` that leases it tasks never
    reaches it."""

    def __init__(self, runtime: Runtime, msg_type: str) -> None:
        self._runtime = runtime
        self.msg_type = msg_type
        self.lost: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def control(
        self, endpoint: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0
    ) -> Any:
        reply = await self._runtime.control(endpoint, msg_type, payload, timeout=timeout)
        if msg_type == self.msg_type and reply.get("leases") and not self.lost:
            self.lost.extend(reply["leases"])
            raise AskTimeout("the reply came after the worker stopped waiting (a cut link, a paused master)")
        return reply


async def _run_losing_the_first(
    tmp_path: Path, msg_type: str, count: int, prefetch: int
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, int, int]], set[int]]:
    """A job of ``count`` tasks run by one getter whose first reply to ``msg_type`` with leases
    is lost: the job's view, the master's status, the runs (task, lease, attempt), the lost
    leases."""
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    m = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    runs: list[tuple[str, int, int]] = []

    async def runner(task: LeasedTask) -> str:
        runs.append((task.task_id, task.lease_id, task.attempt))
        return f"out://{task.task_id}"

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(m.run)
            await m.ready.wait()
            async with (
                Runtime("n1", "w1", hub.transport()) as worker,
                Runtime("op", "op", hub.transport()) as op,
            ):
                job = {"job": {"name": "j", "kind": "k", "count": count, "lease_s": LEASE_S}}
                await op.control(MASTER, "submit", {"job": job, "source": "t"})
                flaky = LosesFirstLeases(worker, msg_type)
                config = GetterConfig(
                    "n1/w1", "n1", kinds=("k",), wait_s=0.05, retry_s=0.01, prefetch=prefetch
                )
                getter = TaskGetter(flaky, MASTER, config, runner)  # type: ignore[arg-type]
                tg.start_soon(getter.run)
                view = await op.control(MASTER, "wait_job", {"job_id": "j", "timeout_s": 60}, timeout=70)
                status = await op.control(MASTER, "status")
                tg.cancel_scope.cancel()
    finally:
        journal.close()
    return view, status, runs, {lease["lease_id"] for lease in flaky.lost}


async def test_a_lease_lost_with_its_reply_is_run_at_once_not_after_it_expires(tmp_path: Path) -> None:
    view, status, runs, lost = await _run_losing_the_first(tmp_path, "request_task", 3, prefetch=1)
    assert view["state"] == "done" and view["counts"]["done"] == 3, view
    assert len(lost) == 1
    assert sorted(t for t, _, _ in runs) == ["j-000000", "j-000001", "j-000002"]  # each once
    assert not lost & {lease for _, lease, _ in runs}  # the lost lease never ran
    assert {attempt for _, _, attempt in runs} == {1}  # losing a reply costs no attempt
    assert status["stale_reports"] == {"lease_unseen": 1}


async def test_leases_lost_with_a_report_s_reply_are_run_at_once_not_after_they_expire(
    tmp_path: Path,
) -> None:
    """A report's reply carries the leases its piggybacked request got: lost, they held the
    worker's slots at the master until they expired (a master paused 15 s idled its workers a
    whole lease). The worker's next request says so (``sync``) and they are leased again."""
    view, status, runs, lost = await _run_losing_the_first(tmp_path, "complete", 5, prefetch=1)
    assert view["state"] == "done" and view["counts"]["done"] == 5, view
    assert lost, "no report's reply carried a lease: the test lost nothing"
    assert sorted(t for t, _, _ in runs) == [f"j-{i:06d}" for i in range(5)]  # each once
    assert not lost & {lease for _, lease, _ in runs}  # the lost leases never ran
    assert {attempt for _, _, attempt in runs} == {1}  # losing a reply costs no attempt
    assert status["stale_reports"].get("lease_unseen") == len(lost), status["stale_reports"]
