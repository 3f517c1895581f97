"""A real getter and a real master (in memory): a task that ends while its master is down (an
upgrade, a reboot) is reported to the master started again on the journal, however long that
took, and runs once.

Before (report jx 3), the getter gave its complete up after ``report_for_s`` (60 s, a bound the
README never named): the restarted master held the lease over, nobody renewed it, and the task
went back to pending and ran a second time once the lease ran out. The getter's clock is moved
an hour on while its report waits, so the test does not wait the minute.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

from support.restarted_master import MASTER, job_after_restart
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.tasks import getter as getter_module
from troupe.runtime.tasks import report_until_answered as report_module
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.transports.base import MemoryHub


async def test_a_complete_sent_while_the_master_is_down_an_hour_reaches_it_once_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hour = {"passed": 0.0}
    clock = SimpleNamespace(monotonic=lambda: time.monotonic() + hour["passed"])
    monkeypatch.setattr(getter_module, "time", clock)  # the getter's own clock only
    monkeypatch.setattr(report_module, "time", clock)  # and its reports'
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    first = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    master_down = anyio.Event()
    runs: list[int] = []

    async def runner(task: LeasedTask) -> str:
        runs.append(task.lease_id)
        await master_down.wait()  # the first copy ends while the master is down
        return f"ref-{task.task_id}"

    try:
        async with anyio.create_task_group() as tg:
            first_stopped = anyio.Event()

            async def serve_first() -> None:
                await first.run()
                first_stopped.set()

            tg.start_soon(serve_first)
            await first.ready.wait()
            async with (
                Runtime("n1", "w1", hub.transport()) as worker,
                Runtime("op", "op", hub.transport()) as op,
            ):
                # a short lease: a report given up would have the task leased again soon after
                job = {"name": "j", "kind": "k", "count": 1, "lease_s": 2.0}
                await op.control(MASTER, "submit", {"job": {"job": job}, "source": "t"})
                config = GetterConfig("n1/w1", "n1", wait_s=0.05, call_timeout_s=2.0, retry_s=0.01)
                getter = TaskGetter(worker, MASTER, config, runner)
                tg.start_soon(getter.run)
                with anyio.fail_after(30):
                    while not runs:
                        await anyio.sleep(0.01)
                    first.stop()  # an upgrade: the master goes down
                    await first_stopped.wait()
                journal.close()
                master_down.set()
                with anyio.fail_after(30):
                    while not getter._reports_out:  # the complete is being sent, to nobody
                        await anyio.sleep(0.01)
                hour["passed"] = 3600.0
                await anyio.sleep(0.1)  # its tries meanwhile find no master
                view = await job_after_restart(hub, tmp_path / "journal.db", op, "j")
                tg.cancel_scope.cancel()
    finally:
        journal.close()
    assert view["state"] == "done" and view["counts"]["done"] == 1, view
    assert runs == [1]  # the restarted master took the first copy's complete: no second run
    assert getter.statistics().lost_reports == 0
