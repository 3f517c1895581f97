"""A real getter and a real master (in memory): a ``complete`` the master refuses fails the
attempt at once, saying why, instead of leaving the task leased until its lease expires.

The runners below return what the master's journal cannot take as a result reference (an
int), or what the worker's codec cannot send (a lone surrogate). Before, the getter logged the
refusal and sent nothing more: each attempt waited out its lease, and the dead letter blamed
the lease.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from structlog.testing import capture_logs

from support.memory_master import master_in_memory, until
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"
LEASE_S = 600.0  # a refused report left its task this long: the test ends long before


async def _dead_letter(tmp_path: Path, result: Any) -> dict[str, Any]:
    """The dead letter of a one-task job whose runner returns ``result`` on each attempt."""
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    m = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))

    async def runner(task: LeasedTask) -> Any:
        return result

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(m.run)
            await m.ready.wait()
            async with (
                Runtime("n1", "w1", hub.transport()) as worker,
                Runtime("op", "op", hub.transport()) as op,
            ):
                job = {
                    "job": {"name": "j", "kind": "k", "count": 1, "lease_s": LEASE_S, "max_attempts": 2}
                    | {"backoff_base_s": 0.01}
                }
                await op.control(MASTER, "submit", {"job": job, "source": "t"})
                config = GetterConfig("n1/w1", "n1", kinds=("k",), wait_s=0.05, retry_s=0.01)
                getter = TaskGetter(worker, MASTER, config, runner)
                tg.start_soon(getter.run)
                with anyio.fail_after(60):
                    view = await op.control(MASTER, "wait_job", {"job_id": "j", "timeout_s": 55}, timeout=58)
                dead = await op.control(MASTER, "dead", {"job_id": "j"})
                tg.cancel_scope.cancel()
    finally:
        journal.close()
    assert view["state"] != "running" and view["counts"]["dead"] == 1, view
    (letter,) = dead
    assert "lease" not in letter["error"].replace("complete report", ""), letter
    return dict(letter)


async def test_a_refused_complete_fails_the_attempt_at_once_saying_why(tmp_path: Path) -> None:
    letter = await _dead_letter(tmp_path, 42)  # not a str: the master refuses the complete
    assert letter["error"].startswith("the master refused this attempt's complete report: "), letter
    assert "result_ref" in letter["error"] and "42" in letter["error"], letter


async def test_a_complete_the_worker_cannot_send_is_the_worker_s_own_failure(tmp_path: Path) -> None:
    """px 7: a reference the worker's own codec refuses (a lone surrogate, from a runner that does
    not check it) never reached the master, yet the dead letter said the master refused it."""
    letter = await _dead_letter(tmp_path, "a\udc80b")
    assert letter["error"].startswith("this worker could not send its complete report: EncodeError: "), letter
    assert "master" not in letter["error"], letter


async def test_a_refused_complete_is_counted_rejected_not_completed(tmp_path: Path) -> None:
    """sm 1: the getter counted a complete the master answered ``rejected`` as completed, so its
    counters (and the scale bench's) said a task was done whose attempt had failed."""

    async def runner(task: LeasedTask) -> Any:
        return 42  # not a str: the master refuses the complete

    async with master_in_memory(tmp_path) as m:
        await m.submit("j", 1, max_attempts=1)
        with capture_logs() as logs:
            async with m.worker("w1", runner) as getter:
                await until(lambda: any(e["event"] == "report_rejected" for e in logs))
                stats = getter.statistics()
    assert (stats.completed, stats.failed) == (0, 0), stats
    assert stats.rejected == 1, stats
    (said,) = [e for e in logs if e["event"] == "report_rejected"]
    assert (said["report"], said["counted"]) == ("complete", "rejected"), said
    assert said["reason"].startswith("the master refused this attempt's complete report: "), said
