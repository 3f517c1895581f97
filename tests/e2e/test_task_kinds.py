"""Task kinds across real nodes: each task goes to a node that runs its kind, and waits visibly otherwise.

A real master and real nodes on loopback: node ``a`` hosts :class:`SleepTask` (kinds ``sleep``
and ``fail``), node ``b`` hosts :class:`NapTask` (kind ``nap``). A job of both kinds wastes no
attempt; a kind no node runs, or a GPU no node has, is shown by ``troupe ctl jobs`` as what the
pending tasks wait for; a node of the missing kind joining finishes the job.

Also here, since it is the other half of "no attempt wasted": a task whose output was committed
while its worker was cut off from the master is done, even after its lease ran out and it was
dead-lettered (DESIGN.md invariant 8).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.chaos import TaskMaster, node_config
from support.cluster import running_node
from troupe.runtime.tasks.output_store import OutputStore
from troupe.runtime.testing import plugin as troupe_testing

pytestmark = pytest.mark.e2e

SLEEP = "troupe.actors.demo.tasks:SleepTask"
NAP = "troupe.actors.demo.tasks:NapTask"
TASKS = 12
CUT_LEASE_S = 4.5  # a copy cut off just after a renewal keeps its lease >= 3 s: time to commit

# The plugin's fixture, also when the `troupe` pytest11 entry point is not installed.
troupe_cluster = troupe_testing.troupe_cluster


def troupe(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run the troupe command on a wide terminal, so that table cells are not wrapped."""
    return subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "400"},
    )


def job_file(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[job]\nname = "{name}"\n{body}')
    return path


def mixed_job(tmp_path: Path) -> Path:
    """Half the tasks of kind sleep (the job's), half of kind nap; one attempt each."""
    tasks = "".join(
        f'\n[[tasks]]\nid = "mix-{i:06d}"\nseed = {i}\n' + ('kind = "nap"\n' if i % 2 else "")
        for i in range(TASKS)
    )
    return job_file(tmp_path, "mix", f'kind = "sleep"\nmax_attempts = 1\n{tasks}')


def jobs(master: TaskMaster) -> dict[str, dict[str, Any]]:
    out = troupe("ctl", "jobs", "--master", master.endpoint, "--json")
    assert out.returncode == 0, out.stderr
    return {j["job_id"]: j for j in json.loads(out.stdout)}


def wait_jobs(master: TaskMaster, ready: Any, timeout: float = 60.0) -> dict[str, dict[str, Any]]:
    """A bounded poll of ``ctl jobs`` until ``ready(jobs)``."""

    async def poll() -> dict[str, dict[str, Any]]:
        with anyio.fail_after(timeout):
            while not ready(view := await anyio.to_thread.run_sync(jobs, master)):
                await anyio.sleep(0.2)
        return view

    return anyio.run(poll)


def test_each_kind_runs_on_its_node_and_a_missing_kind_waits_visibly_until_its_node_joins(
    master: TaskMaster,
    tmp_path: Path,
) -> None:
    """Two nodes with different task actors: every task done with one attempt; waits are explained."""
    with running_node(tmp_path, node_config(master, ["w1"], SLEEP, ""), "a"):
        anyio.run(master.wait_workers, {"a/w1"})
        mix = mixed_job(tmp_path)
        out = troupe("ctl", "submit", str(mix), "--master", master.endpoint)
        assert out.returncode == 0 and "submitted job mix: 12 tasks" in out.stdout, out.stderr
        gpu = job_file(tmp_path, "gpu", 'kind = "sleep"\ncount = 1\n[job.needs]\ngpu = 1\n')
        assert troupe("ctl", "submit", str(gpu), "--master", master.endpoint).returncode == 0

        view = wait_jobs(master, lambda v: v["mix"]["counts"].get("done") == TASKS // 2)
        assert view["mix"]["counts"]["pending"] == TASKS // 2 and not view["mix"]["counts"]["dead"]
        assert [w["reason"] for w in view["mix"]["waiting"]] == [
            "waiting for kind nap: no live worker runs it"
        ]
        assert [w["reason"] for w in view["gpu"]["waiting"]] == ["waiting for gpu=1: no worker has it"]
        table = troupe("ctl", "jobs", "--master", master.endpoint)
        assert table.returncode == 0, table.stderr
        # The waiting tasks' table: job, how many, on what (a row per reason).
        assert re.search(r"mix\s+│\s+6\s+│\s+waiting for kind nap: no live worker runs it", table.stdout), (
            table.stdout
        )
        assert re.search(r"gpu\s+│\s+1\s+│\s+waiting for gpu=1: no worker has it", table.stdout), table.stdout

        again = troupe("ctl", "submit", str(mix), "--master", master.endpoint)
        assert again.returncode == 0 and "already submitted" in again.stdout, again.stderr
        other = job_file(tmp_path, "mix", 'kind = "sleep"\ncount = 3\n')
        taken = troupe("ctl", "submit", str(other), "--master", master.endpoint)
        assert taken.returncode == 1 and "taken" in taken.stderr

        with running_node(tmp_path, node_config(master, ["w1"], NAP, ""), "b"):
            job = anyio.run(master.wait_job, "mix", 60.0)
    assert job["state"] == "done" and job["counts"]["done"] == TASKS and job["waiting"] == []
    master.check_exactly_once(job, "mix-", TASKS)
    results = {r["task_id"]: r for r in master.results("mix-")}
    assert all(r["attempt"] == 1 for r in results.values())
    assert {t for t, r in results.items() if r["node"] == "b"} == {f"mix-{i:06d}" for i in range(1, TASKS, 2)}


async def test_a_commit_made_while_cut_off_from_the_master_is_the_truth_after_the_heal(
    master: TaskMaster,
    troupe_cluster: Any,
    tmp_path: Path,
) -> None:
    """max_attempts = 1, a partition longer than the lease: dead, job failed; the heal's Complete makes both
    done."""
    cluster = troupe_cluster(node_config(master, ["w1"], SLEEP, ""), "p")
    await master.wait_workers({"p/w1"})
    gate = tmp_path / "gate"
    job_id = await master.submit(
        "cut",
        "sleep",
        1,
        {"min_ms": 0, "max_ms": 0, "wait_for": str(gate)},
        lease_s=CUT_LEASE_S,
        max_attempts=1,
    )
    with anyio.fail_after(30):
        while not await master.used("p/w1"):
            await anyio.sleep(0.02)
    reply = await cluster.chaos("partition", "w1", peers=[master.endpoint])
    assert reply["workers"]["w1"]["partitioned_peers"] == [master.endpoint]
    gate.touch()  # the copy commits now, cut off: neither its renewals nor its report get through
    store = OutputStore(master.outputs, durable=False)
    with anyio.fail_after(30):
        while not store.is_committed("cut-000000"):
            await anyio.sleep(0.02)
    failed = await master.wait_job(job_id, 60)
    assert failed["state"] == "failed" and failed["counts"]["dead"] == 1
    await cluster.heal("w1")
    with anyio.fail_after(60):  # the worker's report, retried, lands after the heal
        while (job := await master.call("wait_job", {"job_id": job_id}))["state"] != "done":
            await anyio.sleep(0.1)
    master.check_exactly_once(job, "cut-", 1)
    assert await master.call("dead", {"job_id": job_id}) == []


def test_submit_id_names_a_new_job_and_its_tasks(master: TaskMaster, tmp_path: Path) -> None:
    """The same file under another --id is another job (its generated tasks had kept the file's
    name and were refused as used twice); an --id that is no name is refused in one line; a
    cancelled job submitted again is refused: it does not run again."""
    job = job_file(tmp_path, "demo", 'kind = "nap"\ncount = 3\n')
    first = troupe("ctl", "submit", str(job), "--master", master.endpoint)
    assert first.returncode == 0 and "submitted job demo: 3 tasks" in first.stdout, first.stderr
    second = troupe("ctl", "submit", str(job), "--id", "demo-2", "--master", master.endpoint)
    assert second.returncode == 0 and "submitted job demo-2: 3 tasks" in second.stdout, second.stderr
    assert {"demo", "demo-2"} <= set(jobs(master))

    bad = troupe("ctl", "submit", str(job), "--id", "a b/../x", "--master", master.endpoint)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "error: job id 'a b/../x' cannot name outputs; use 1-200 ASCII letters (a-z, A-Z), digits, "
        "'.', '_' or '-', "
        "starting with a letter or digit"
    ]

    assert troupe("ctl", "cancel", "demo-2", "--master", master.endpoint).returncode == 0
    twice = troupe("ctl", "cancel", "demo-2", "--master", master.endpoint)  # said again: it holds
    assert twice.returncode == 0, twice.stderr
    assert "job demo-2 ended already (cancelled): nothing to cancel" in twice.stdout
    again = troupe("ctl", "submit", str(job), "--id", "demo-2", "--master", master.endpoint)
    assert again.returncode == 1, again.stderr  # nothing was submitted: a script must not go on
    assert "error: job demo-2 was submitted before and cancelled: its tasks do not run again" in again.stderr
