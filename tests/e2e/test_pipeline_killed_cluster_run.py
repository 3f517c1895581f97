"""A `troupe run --cluster` killed with SIGKILL (its host crashed, the OOM killer) stops nothing
itself: its nodes stop the replicas it started once it misses their pings, and the same command
run again finishes the dataset. The replicas ran on for ever, and every rerun failed ("a worker
named 'killed-make-0' already runs on node na") until each node was restarted.

Two nodes on loopback (127.0.0.2 and .3) joined to a master; the run's stages are the direct
plane's test stages, slowed so that the kill lands mid-run. Every process is reaped by its pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.chaos import TaskMaster
from support.tagged_nodes import tagged_nodes
from troupe.cli.master_client import master_call
from troupe.runtime.testing.plugin import import_path, reap

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NODES = {"na": ("127.0.0.2", "a"), "nb": ("127.0.0.3", "b")}
ITEMS = 12
WAIT_S = 120  # bounds on polls, never on speed
PIPELINE = """
[pipeline]
name = "killed"
items = {items}

[[stages]]
name = "make"
actor = "support.hook_stages:RecordingStage"
replicas = 2
kwargs = {{ log = "{log}", cost_s = 0.5 }}

[[stages]]
name = "pass"
actor = "support.hook_stages:EchoStage"
"""


@pytest.fixture
def two_nodes(tmp_path: Path, master: TaskMaster) -> Iterator[TaskMaster]:
    with tagged_nodes(master, tmp_path, NODES, env={"PYTHONPATH": import_path()}):
        yield master


def _command(config: Path, out: Path, master: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "troupe.cli.main",
        "run",
        str(config),
        "--out",
        str(out),
        "--cluster",
        master,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": import_path(), "COLUMNS": "200"}


async def _replicas_running(master: TaskMaster) -> list[str]:
    """The run's replicas the nodes still run (their workers' records, asked of each node)."""
    status = await master.call("status")
    running: list[str] = []
    for node in status["nodes"]:
        if not node.get("alive"):
            continue
        reply: Any = await master_call(node["endpoint"], "supervision", None, 10.0)
        running += [
            w["name"] for w in reply["workers"] if w["name"].startswith("killed-") and w["state"] == "running"
        ]
    return running


async def _wait_until(what: str, check: Any) -> None:
    with anyio.fail_after(WAIT_S):
        while not await check():
            await anyio.sleep(0.5)


def test_a_killed_runs_replicas_are_stopped_and_the_same_command_finishes(
    tmp_path: Path, two_nodes: TaskMaster
) -> None:
    log = tmp_path / "records.jsonl"
    config = tmp_path / "killed.toml"
    config.write_text(PIPELINE.format(items=ITEMS, log=log), encoding="utf-8")
    out = tmp_path / "out"
    run = subprocess.Popen(
        _command(config, out, two_nodes.endpoint),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not (log.exists() and log.read_text().count('"process"') >= 2):  # items moving
            assert run.poll() is None, "the run ended before it was killed"
            assert time.monotonic() < deadline, "no item was processed"
            time.sleep(0.1)
        assert anyio.run(_replicas_running, two_nodes)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(30)
    finally:
        reap(run, [])

    async def none_left() -> bool:
        return not await _replicas_running(two_nodes)

    anyio.run(_wait_until, "the nodes stop the killed run's replicas", none_left)

    again = subprocess.run(
        [*_command(config, out, two_nodes.endpoint), "--json"],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        env=_env(),
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["items"]["dead"] == 0
    (job,) = [j for j in anyio.run(two_nodes.call, "jobs") if j["job_id"] == "killed"]
    assert job["counts"].get("done") == ITEMS, job
    assert not anyio.run(_replicas_running, two_nodes)  # the rerun stopped its own at its end
