"""A master's listings of its jobs stay bounded: its ``status`` shows the running jobs and the last
finished ones, and says how many it leaves out (it listed every job ever submitted, thousands
after weeks, the reply growing toward the message bound); ``jobs {last}`` does the same on
asking, ``jobs`` alone lists them all (report lk 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.memory_master import Master1, master_in_memory
from troupe.runtime.errors import BadRequest
from troupe.runtime.tasks.master.job_listing import STATUS_FINISHED_JOBS, recent_jobs


async def _jobs(m: Master1) -> None:
    """f00..f13 finished (cancelled), r0 and r1 running (no worker takes their tasks), in this
    submit order: r0, f00..f05, r1, f06..f13."""
    await m.submit("r0", 1)
    for i in range(14):
        if i == 6:
            await m.submit("r1", 1)
        await m.submit(f"f{i:02d}", 1)
        await m.call("cancel", {"job_id": f"f{i:02d}"})


async def test_status_shows_the_running_jobs_and_the_last_finished(tmp_path: Path) -> None:
    async with master_in_memory(tmp_path) as m:
        await _jobs(m)
        status = await m.call("status")
        every = await m.call("jobs")
        last_two = await m.call("jobs", {"last": 2})
        running = await m.call("jobs", {"last": 0})
    assert STATUS_FINISHED_JOBS == 10
    shown = ["r0", "f04", "f05", "r1", *(f"f{i:02d}" for i in range(6, 14))]  # in submit order
    assert [j["job_id"] for j in status["jobs"]] == shown
    assert status["jobs_not_shown"] == 4
    assert len(every) == 16  # the jobs control, as before: every job, in submit order
    assert [j["job_id"] for j in last_two] == ["r0", "r1", "f12", "f13"]
    assert [j["job_id"] for j in running] == ["r0", "r1"]
    assert last_two[0] == every[0]  # the same shape, job by job


@pytest.mark.parametrize("payload", [{"last": -1}, {"last": "all"}, {"last": True}, [1]])
async def test_a_bad_last_is_a_bad_request(tmp_path: Path, payload: object) -> None:
    async with master_in_memory(tmp_path) as m:
        with pytest.raises(BadRequest, match="jobs"):
            await m.call("jobs", payload)


def test_recent_jobs_keeps_the_order_and_counts_what_it_leaves_out() -> None:
    jobs = ["a", "R", "b", "c", "S", "d"]  # upper case: running

    def running(j: str) -> bool:
        return j.isupper()

    assert recent_jobs(jobs, running, 2) == (["R", "c", "S", "d"], 2)
    assert recent_jobs(jobs, running, 0) == (["R", "S"], 4)
    assert recent_jobs(jobs, running, 10) == (jobs, 0)
