"""A running master compacts a job that finished an hour ago by itself, in its journal and its
book, as a restart would (report lk 1: a master left up for days kept every task of every job
it had run, about 0.9 KiB each, until it was restarted). Not before the hour; and after it the
master answers as a restarted one: the same ``jobs``, dead letters kept, a submit of the job
again "already", a late Complete refused as unknown, a retry, and a restart to the same book."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from support.memory_master import master_in_memory
from troupe.runtime.errors import TaskError
from troupe.runtime.tasks.master.journal_open import COMPACT_AFTER_S, open_journal
from troupe.runtime.tasks.state import Complete, Reject, TaskState
from troupe.runtime.tasks.task_actor import LeasedTask

JOB = {"job": {"job": {"name": "j", "kind": "k", "count": 4, "max_attempts": 1}}, "source": "t"}


class Wall:
    """The master's wall clock, moved on by the test (what was journaled keeps its real time)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


async def test_a_finished_job_is_compacted_after_the_hour_and_answers_as_after_a_restart(
    tmp_path: Path,
) -> None:
    wall = Wall()
    leases: list[int] = []
    disk_full = True

    async def write(task: LeasedTask) -> str:
        leases.append(task.lease_id)
        if disk_full and task.task_id == "j-000001":
            raise OSError(28, "No space left on device")
        await anyio.lowlevel.checkpoint()
        return f"out/{task.task_id}"

    async def wait_job() -> dict[str, Any]:
        job: dict[str, Any] = await m.call("wait_job", {"job_id": "j", "timeout_s": 10.0}, timeout=15.0)
        return job

    async with master_in_memory(tmp_path, wall) as m, m.worker("w", write):
        await m.call("submit", JOB)
        assert (await wait_job())["state"] == "failed"
        jobs, dead = await m.call("jobs"), await m.call("dead", {"job_id": "j"})
        book = m.master.book

        wall.ahead = COMPACT_AFTER_S - 60.0  # finished less than an hour ago: kept
        assert (await m.master.compact()).jobs == 0
        assert book.task("j-000000").state is TaskState.DONE

        wall.ahead = COMPACT_AFTER_S + 1.0
        done = await m.master.compact()
        assert (done.jobs, done.task_rows, done.job_ids) == (1, 3, ("j",))
        with pytest.raises(TaskError, match="unknown task 'j-000000'"):
            book.task("j-000000")
        assert (await m.call("jobs"), await m.call("dead", {"job_id": "j"})) == (jobs, dead)
        assert (await m.call("submit", JOB))["already"] is True
        (refused,) = await m.master.dispatcher.handle(Complete("n1/w", "j-000000", leases[0], "out"))
        assert isinstance(refused, Reject) and refused.reason == "unknown task 'j-000000'"
        assert (await m.master.compact()).jobs == 0  # once

        disk_full = False
        assert (await m.call("retry_dead", {"job_id": "j"}))["retried"] == 1
        again = await wait_job()
        assert (again["state"], again["total"], again["counts"]["done"]) == ("done", 4, 4)
        assert leases[-1] > max(leases[:-1])  # lease ids go on above every one issued
        seen = m.master.book.jobs()
        assert len(m.master.book._tasks) == 1  # the retried task; the others compacted away

    journal, restarted = open_journal(tmp_path / "journal.db")
    journal.close()
    assert restarted.jobs() == seen
