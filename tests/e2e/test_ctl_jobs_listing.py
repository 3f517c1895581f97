"""`troupe ctl status` shows the running jobs and the last 10 finished, and says how many it
leaves out; `troupe ctl jobs --running` / `--last N` list fewer, in the same JSON shape. Every job
ever submitted was a row of both, thousands after weeks (report lk 2). A real master process."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from support.chaos import TaskMaster
from support.cluster import ctl
from troupe.cli.commands import ctl as command
from troupe.runtime.testing.plugin import free_endpoint

pytestmark = pytest.mark.e2e


async def _jobs(master: TaskMaster) -> None:
    """j00..j11 finished (cancelled), then j12 running: no worker runs nap."""
    for i in range(13):
        await master.submit(f"j{i:02d}", "nap", 1, {})
        if i < 12:
            await master.call("cancel", {"job_id": f"j{i:02d}"})


def _ids(out: str) -> list[str]:
    return [j["job_id"] for j in json.loads(out)]


def test_status_and_jobs_list_the_running_jobs_and_the_last_finished(master: TaskMaster) -> None:
    anyio.run(_jobs, master)
    # No node answers there: the master's view is shown alone, a note says so on stderr.
    status = ctl("ctl", "status", "--node", free_endpoint(), "--master", master.endpoint)
    assert status.returncode == 0, status.stderr
    assert "2 finished jobs not shown: `troupe ctl jobs` lists them all" in status.stdout
    assert "j12" in status.stdout and "j02" in status.stdout and "j01" not in status.stdout

    every = ctl("ctl", "jobs", "--master", master.endpoint, "--json")
    running = ctl("ctl", "jobs", "--master", master.endpoint, "--running", "--json")
    last = ctl("ctl", "jobs", "--master", master.endpoint, "--last", "2", "--json")
    table = ctl("ctl", "jobs", "--master", master.endpoint, "--last", "1")
    for out in (every, running, last, table):
        assert out.returncode == 0, out.stderr
    assert _ids(every.stdout) == [f"j{i:02d}" for i in range(13)]  # as before: every job
    assert _ids(running.stdout) == ["j12"]
    assert _ids(last.stdout) == ["j10", "j11", "j12"]
    assert json.loads(last.stdout)[-1] == json.loads(every.stdout)[-1]  # the same shape
    assert "j11" in table.stdout and "j10" not in table.stdout

    both = ctl("ctl", "jobs", "--master", master.endpoint, "--running", "--last", "2")
    assert both.returncode == 2 and "--running and --last together" in both.stderr


def test_a_master_that_sends_every_job_is_trimmed_by_the_cli() -> None:
    """A master older than the trimmed status sends every job, with no count of those left out."""
    reply: dict[str, Any] = {
        "jobs": [{"job_id": f"f{i}", "state": "done"} for i in range(12)]
        + [{"job_id": "r", "state": "running"}]
    }
    assert command._recent_jobs_only(reply) == 2
    assert [j["job_id"] for j in reply["jobs"]] == [*(f"f{i}" for i in range(2, 12)), "r"]
    trimmed = {"jobs": reply["jobs"], "jobs_not_shown": 7}  # a newer master's: it counted them
    assert command._recent_jobs_only(trimmed) == 7
