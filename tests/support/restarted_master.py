"""A master started again on a journal in memory, at the address its workers call, kept until a
job has ended there (tests of what survives a master's restart)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.transports.base import MemoryHub

__all__ = ["MASTER", "job_after_restart"]

MASTER = "mem://master"


async def job_after_restart(hub: MemoryHub, journal_path: Path, op: Runtime, job_id: str) -> dict[str, Any]:
    """Start a master on ``journal_path`` (the one before it stopped, its journal closed), wait
    for ``job_id`` to end, stop that master; return the job's view (``wait_job``)."""
    journal, book = open_journal(journal_path)
    try:
        master = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(master.run)
            await master.ready.wait()
            with anyio.fail_after(60):
                view = await op.control(MASTER, "wait_job", {"job_id": job_id, "timeout_s": 55}, timeout=58)
            master.stop()
        return dict(view)
    finally:
        journal.close()
