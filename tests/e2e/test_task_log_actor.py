"""Task-side log lines say who logged them.

A real master and a real node with one task worker: every ``output_committed`` line (logged by
the OutputStore, from the task actor's ``run_task``) names the actor, the worker process and
the worker's own pid, as handler lines do; the master's lines about a node stay the master's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from support.chaos import TaskMaster, node_config
from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import Cluster

pytestmark = pytest.mark.e2e

# The plugin's fixture, also when the `troupe` pytest11 entry point is not installed.
troupe_cluster = troupe_testing.troupe_cluster

TASKS = 8


async def test_every_output_committed_line_names_the_actor_that_ran_the_task(
    master: TaskMaster, troupe_cluster: Any
) -> None:
    """A job's commits are logged by the worker with actor=task, its process and its own pid."""
    cluster: Cluster = troupe_cluster(
        node_config(master, ["w1"], "troupe.actors.demo.tasks:SleepTask", ""), "n1"
    )
    await master.wait_workers({"n1/w1"})
    job_id = await master.submit(
        "logged", "sleep", TASKS, {"min_ms": 1, "max_ms": 5}, lease_s=30, max_attempts=3
    )
    job = await master.wait_job(job_id, 60)
    master.check_exactly_once(job, "logged-", TASKS)
    pid = (await cluster.worker("w1"))["pid"]
    lines = [json.loads(ln) for ln in (cluster.log_dir / "n1.jsonl").read_text().splitlines()]
    commits = [ln for ln in lines if ln["event"] == "output_committed"]
    assert len(commits) == TASKS
    assert {(c.get("actor"), c["process"], c["pid"]) for c in commits} == {("task", "w1", pid)}
    assert {c["task_id"] for c in commits} == {f"logged-{i:06d}" for i in range(TASKS)}


def test_the_master_s_lines_about_a_node_say_the_master_logged_them(
    master: TaskMaster, troupe_cluster: Any, tmp_path: Path
) -> None:
    """node_joined names the joining node as event_node; node and process stay the master's own."""
    troupe_cluster(node_config(master, ["w1"], "troupe.actors.demo.tasks:SleepTask", ""), "n1")
    log = tmp_path / "master" / "logs" / "master.jsonl"  # where start_master puts its logs
    deadline = time.monotonic() + 60
    joined: list[dict[str, Any]] = []
    while not joined and time.monotonic() < deadline:  # a bounded poll of the master's log
        joined = [ln for ln in map(json.loads, log.read_text().splitlines()) if ln["event"] == "node_joined"]
        time.sleep(0.05)
    assert joined, "the master never logged node_joined"
    assert (joined[0]["node"], joined[0]["process"], joined[0]["event_node"]) == ("master", "master", "n1")
    assert joined[0]["pid"] == master.proc.pid


async def test_a_failed_attempt_is_logged_by_the_worker_that_ran_it(
    master: TaskMaster, troupe_cluster: Any
) -> None:
    """Each failed attempt is a warning in the worker's node's log, naming the task, its attempt
    and the error, with the traceback: where `troupe logs tail --task` looks (only the master's
    own log said a task failed, when it dead-lettered it)."""
    cluster: Cluster = troupe_cluster(
        node_config(master, ["w1"], "troupe.actors.demo.tasks:SleepTask", ""), "n1"
    )
    await master.wait_workers({"n1/w1"})
    job_id = await master.submit("failing", "fail", 1, {}, lease_s=30, max_attempts=2, backoff_base_s=0.01)
    job = await master.wait_job(job_id, 60)
    assert job["counts"]["dead"] == 1, job
    lines = [json.loads(ln) for ln in (cluster.log_dir / "n1.jsonl").read_text().splitlines()]
    failed = [ln for ln in lines if ln["event"] == "task_failed"]
    assert [(f["task_id"], f["attempt"], f["level"]) for f in failed] == [
        ("failing-000000", 1, "warning"),
        ("failing-000000", 2, "warning"),
    ]
    assert all("fails on purpose" in f["error"] and "Traceback" in f["traceback"] for f in failed)
