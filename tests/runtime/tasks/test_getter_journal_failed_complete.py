"""A real getter and a real master (in memory) whose journal fails on the batch that holds a
task's ``complete`` (a disk that filled from elsewhere): the master stops, and answers the
complete with its JournalError. Nothing of that batch was kept: the master restarted on the
journal holds the task over as leased, and the worker's complete, sent again to it, makes the
task done.

Before (report jx 1), the getter took the JournalError for a refusal of its complete and sent a
``fail`` instead: with one attempt allowed, the restarted master dead-lettered a task whose
output was committed; with more, it ran the task again.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from support.restarted_master import MASTER, job_after_restart
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import JournalError
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.transports.base import MemoryHub

DISK_FULL = "journal journal.db: append failed: [Errno 28] No space left on device"


async def _until_failed(master: Master, stopped: anyio.Event) -> None:
    try:
        await master.run()
    except JournalError:
        stopped.set()  # the failure the test makes: master.failure holds it


async def test_a_complete_the_journal_failed_to_keep_reaches_the_restarted_master(tmp_path: Path) -> None:
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    first = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    disk_full = anyio.Event()
    kept = journal.commit

    def commit() -> None:
        if disk_full.is_set():
            raise JournalError(DISK_FULL)
        kept()

    journal.commit = commit  # type: ignore[method-assign]
    runs: list[int] = []

    async def runner(task: LeasedTask) -> str:
        runs.append(task.lease_id)
        disk_full.set()  # the disk fills now: the batch that holds this complete fails
        return f"ref-{task.task_id}"

    try:
        async with anyio.create_task_group() as tg:
            first_stopped = anyio.Event()
            tg.start_soon(_until_failed, first, first_stopped)
            await first.ready.wait()
            async with (
                Runtime("n1", "w1", hub.transport()) as worker,
                Runtime("op", "op", hub.transport()) as op,
            ):
                job = {"name": "j", "kind": "k", "count": 1, "lease_s": 600.0, "max_attempts": 1}
                await op.control(MASTER, "submit", {"job": {"job": job}, "source": "t"})
                config = GetterConfig("n1/w1", "n1", wait_s=0.05, call_timeout_s=2.0, retry_s=0.01)
                getter = TaskGetter(worker, MASTER, config, runner)
                tg.start_soon(getter.run)
                with anyio.fail_after(30):
                    await first_stopped.wait()
                assert str(first.failure) == DISK_FULL
                journal.close()
                # room made on the disk: the master restarts on its journal
                reopened, held_over = open_journal(tmp_path / "journal.db")
                reopened.close()
                assert held_over.task("j-000000").state.value == "leased"  # nothing of the batch kept
                view = await job_after_restart(hub, tmp_path / "journal.db", op, "j")
                tg.cancel_scope.cancel()
    finally:
        journal.close()
    assert view["state"] == "done" and view["counts"]["done"] == 1 and view["counts"]["dead"] == 0, view
    assert runs == [1]  # run once: the restarted master took the first copy's complete
