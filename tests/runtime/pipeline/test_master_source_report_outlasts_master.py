"""A real pipeline source and a real master (in memory): an item that ends while its master is
down (a cluster's master restarted: an upgrade, a reboot) is reported to the master started
again on the journal, and runs once.

Before (report pl 3), ``troupe run --cluster``'s source sent each report once: one sent while
the master was down was lost, the restarted master held the lease over until it ran out, and
the item was leased, and ran, a second time. A worker's getter kept its reports so since jx 3;
the source now sends them the same way (``tasks/report_until_answered.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from support.restarted_master import MASTER, job_after_restart
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.pipeline.source import MasterSource
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.transports.base import MemoryHub

BOUND_S = 30  # against a hang only


async def test_an_item_ended_while_the_master_is_down_is_reported_once_it_is_back(tmp_path: Path) -> None:
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    first = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    taken: list[Any] = []  # every item the source handed over: a second is the item run again
    try:
        async with anyio.create_task_group() as tg:
            first_stopped = anyio.Event()

            async def serve_first() -> None:
                await first.run()
                first_stopped.set()

            tg.start_soon(serve_first)
            await first.ready.wait()
            async with (
                Runtime("n1", "run", hub.transport()) as run,
                Runtime("op", "op", hub.transport()) as op,
            ):
                # a short lease: a report lost would have the item leased again soon after
                job = {"name": "j", "kind": "j", "count": 1, "lease_s": 2.0}
                await op.control(MASTER, "submit", {"job": {"job": job}, "source": "t"})
                source = MasterSource(run, MASTER, "j", slots=1, poll_s=0.05)

                async def take_all() -> None:
                    while True:
                        taken.extend(source.take(1))
                        await anyio.sleep(0.01)  # a bounded poll: cancelled with the group

                tg.start_soon(source.run, lambda: None)
                tg.start_soon(take_all)
                with anyio.fail_after(BOUND_S):
                    while not taken:
                        await anyio.sleep(0.01)
                    first.stop()  # the master goes down while the item runs
                    await first_stopped.wait()
                journal.close()
                source.settle(taken[0].task_id, "ok")  # the item ends while it is down
                with anyio.fail_after(BOUND_S):
                    while source._reports:  # its report is taken to be sent, to nobody
                        await anyio.sleep(0.01)
                await anyio.sleep(0.6)  # a try or two meanwhile find no master
                view = await job_after_restart(hub, tmp_path / "journal.db", op, "j")
                tg.cancel_scope.cancel()
    finally:
        journal.close()
    assert view["state"] == "done" and view["counts"]["done"] == 1, view
    assert [item.task_id for item in taken] == ["j-000000"]  # leased once: not run again
