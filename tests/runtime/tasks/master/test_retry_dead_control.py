"""The master's ``retry_dead`` control: a failed job's dead tasks run again on the workers, a
``wait_job`` waits for the job's new end, and what cannot be retried is refused clearly."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import anyio
import pytest

from support.memory_master import master_in_memory
from troupe.runtime.errors import BadRequest, TaskError
from troupe.runtime.tasks.task_actor import LeasedTask


async def test_a_failed_jobs_dead_tasks_run_again_and_the_job_ends_done(tmp_path: Path) -> None:
    """The disk was full on the first try: the retry runs exactly the dead tasks, once each."""
    ran: Counter[str] = Counter()
    disk_full = True

    async def write(task: LeasedTask) -> str:
        ran[task.task_id] += 1
        if disk_full and task.task_id.endswith(("1", "3")):
            raise OSError(28, "No space left on device")
        await anyio.lowlevel.checkpoint()
        return f"out/{task.task_id}"

    async with master_in_memory(tmp_path) as m, m.worker("w", write):
        await m.submit("j", 4, max_attempts=2, backoff_base_s=0.0)
        first = await m.call("wait_job", {"job_id": "j", "timeout_s": 10.0}, timeout=15.0)
        assert (first["state"], first["counts"]["dead"]) == ("failed", 2)
        disk_full = False
        reply = await m.call("retry_dead", {"job_id": "j"})
        assert reply == {"job_id": "j", "retried": 2, "state": "running"}
        second = await m.call("wait_job", {"job_id": "j", "timeout_s": 10.0}, timeout=15.0)
        assert (second["state"], second["counts"].get("dead", 0), second["counts"]["done"]) == ("done", 0, 4)
        assert await m.call("dead", {"job_id": "j"}) == []
        again = await m.call("retry_dead", {"job_id": "j"})
    assert ran == Counter({"j-000000": 1, "j-000001": 3, "j-000002": 1, "j-000003": 3})
    assert again == {"job_id": "j", "retried": 0, "state": "done"}


async def test_retry_of_an_unknown_or_cancelled_job_or_a_bad_payload_is_refused(tmp_path: Path) -> None:
    async with master_in_memory(tmp_path) as m:
        with pytest.raises(TaskError, match="unknown job 'nope'"):
            await m.call("retry_dead", {"job_id": "nope"})
        await m.submit("c", 2)
        await m.call("cancel", {"job_id": "c"})
        with pytest.raises(TaskError, match="was cancelled: its tasks do not run again"):
            await m.call("retry_dead", {"job_id": "c"})
        with pytest.raises(BadRequest, match="retry_dead"):
            await m.call("retry_dead", {"job": "c"})
