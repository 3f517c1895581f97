"""Real `troupe master` processes on one journal: one master at a time, checked rows, compaction;
and on two journals under one name and log folder: one master at a time there too."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.cli_scripts import HELD_AFTER_A_CALL
from support.cli_session import troupe_in_session
from support.cluster import ctl, free_endpoint, reap
from support.port_range import test_endpoint
from support.run_resume_helpers import running
from troupe.cli.master_client import master_call
from troupe.runtime.errors import ActorStopped, AskTimeout, Unreachable
from troupe.runtime.tasks.book import TaskBook, split_commands
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.state import (
    Complete,
    Event,
    Fail,
    JobPolicy,
    Lease,
    RequestTask,
    Resources,
    SubmitJob,
    TaskSpec,
    WorkerJoined,
)

pytestmark = pytest.mark.e2e


def start_master(journal: Path, endpoint: str, logs: Path, *extra: str) -> subprocess.Popen[str]:
    """A `troupe master start`; its console output goes to a file under ``logs``."""
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"console-{endpoint.rsplit(':', 1)[1]}.txt", "w") as console:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "troupe.cli.main",
                "master",
                "start",
                "--journal",
                str(journal),
                "--endpoint",
                endpoint,
                "--logs",
                str(logs),
                *extra,
            ],
            stdout=console,
            stderr=subprocess.STDOUT,
            text=True,
        )


def serving(endpoint: str, proc: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, Any]:
    """Bounded poll until the master answers a ping (fails at once if it exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the master exited {proc.returncode}"
        try:
            return anyio.run(master_call, endpoint, "ping", None, 2.0)
        except (Unreachable, ActorStopped, AskTimeout):
            time.sleep(0.1)
    raise AssertionError(f"no master answered at {endpoint} within {timeout}s")


def refusal(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    return " ".join(out.stderr.split())


def test_a_second_master_on_a_journal_is_refused_until_the_first_dies(tmp_path: Path) -> None:
    """Two masters never serve one journal; a SIGKILLed holder frees it for the next at once."""
    journal, logs = tmp_path / "journal.db", tmp_path / "logs"
    endpoint = free_endpoint()
    first = start_master(journal, endpoint, logs, "--new")
    third: subprocess.Popen[str] | None = None
    try:
        serving(endpoint, first)
        second = ctl(
            "master",
            "start",
            "--journal",
            str(journal),
            "--endpoint",
            free_endpoint(),
            "--logs",
            str(logs),
            "--new",
            timeout=60,
        )
        assert f"journal {journal} is held by another master (pid {first.pid})" in refusal(second)
        compacted = ctl("master", "compact", "--journal", str(journal), timeout=60)
        assert f"(pid {first.pid})" in refusal(compacted)

        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        endpoint = free_endpoint()
        third = start_master(journal, endpoint, logs)
        assert serving(endpoint, third)["pid"] == third.pid
    finally:
        reap(first, [])
        if third is not None:
            reap(third, [])


def test_of_two_masters_started_at_once_on_one_journal_one_serves(tmp_path: Path) -> None:
    """ns: exclusive from the first step. The first is held where both of two started at once
    would be, its lock taken and its journal not yet made (``--new``): the second, started then,
    is refused naming it (the lock is taken before anything of the journal is looked at past its
    path) and writes nothing into the first's log; let go, the first makes the journal and serves."""
    journal, logs = tmp_path / "journal.db", tmp_path / "logs"
    held, release = tmp_path / "held", tmp_path / "release"
    hook = ["troupe.runtime.tasks.journal_lock:JournalLock.acquire", str(held), str(release)]
    start = ["master", "start", "--journal", str(journal), "--logs", str(logs), "--new"]
    endpoint = test_endpoint()
    with running([*hook, *start, "--endpoint", endpoint], tmp_path, "first", code=HELD_AFTER_A_CALL) as first:
        first.wait_until("its lock taken and its journal not made", held.exists, timeout=120)
        assert not journal.exists()
        second = troupe_in_session(
            *start, "--endpoint", test_endpoint(), timeout=120
        )  # one that serves: killed
        release.write_text("")
        assert f"journal {journal} is held by another master (pid {first.proc.pid})" in refusal(second)
        assert serving(endpoint, first.proc)["pid"] == first.proc.pid
        records = [json.loads(line) for line in (logs / "master.jsonl").read_text().splitlines()]
        assert {r["pid"] for r in records} == {first.proc.pid}, "the refused master wrote into its log"
        first.signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 128 + signal.SIGTERM, first.text()[-3000:]


def test_a_master_through_a_hard_link_to_a_held_journal_is_refused(tmp_path: Path) -> None:
    """A hard link in another folder names the same file, and gets round no lock: the second
    master is refused naming the first (it had served the file too, with a -wal of its own)."""
    journal, logs = tmp_path / "j1" / "journal.db", tmp_path / "logs"
    journal.parent.mkdir()
    endpoint = free_endpoint()
    first = start_master(journal, endpoint, logs, "--new")
    try:
        serving(endpoint, first)
        hard = tmp_path / "hard.db"
        os.link(journal, hard)
        second = ctl(
            "master",
            "start",
            "--journal",
            str(hard),
            "--endpoint",
            free_endpoint(),
            "--logs",
            str(logs),
            timeout=60,
        )
        assert f"journal {hard} is held by another master (pid {first.pid})" in refusal(second)
        assert serving(endpoint, first)["pid"] == first.pid  # the first serves on
    finally:
        reap(first, [])


def test_a_second_master_of_a_name_and_log_folder_is_refused_whatever_its_journal(tmp_path: Path) -> None:
    """Two masters of one --name and --logs on two journals both ran and wrote one log,
    interleaved: the second is refused in one line naming the first, before it writes a line;
    the name is the next master's once the first is gone (SIGKILL too: a flock)."""
    logs = tmp_path / "logs"
    endpoint = test_endpoint()
    first = start_master(tmp_path / "j1.db", endpoint, logs, "--new", "--name", "m1")
    third: subprocess.Popen[str] | None = None
    try:
        serving(endpoint, first)
        second = ctl(
            *("master", "start", "--journal", str(tmp_path / "j2.db"), "--new", "--name", "m1"),
            *("--endpoint", test_endpoint(), "--logs", str(logs)),
            timeout=60,
        )
        said = refusal(second)
        assert said == (
            f"error: master 'm1': its name is held in {logs} by pid {first.pid} (a master or node "
            "running under it): both would write m1.jsonl; stop it, or give this master another "
            "--name or --logs"
        ), said
        assert not (tmp_path / "j2.db").exists()  # refused before its journal was touched
        assert serving(endpoint, first)["pid"] == first.pid
        records = [json.loads(line) for line in (logs / "m1.jsonl").read_text().splitlines()]
        assert {r["pid"] for r in records} == {first.pid}, "the refused master wrote into its log"

        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        endpoint = test_endpoint()
        third = start_master(tmp_path / "j2.db", endpoint, logs, "--new", "--name", "m1")
        assert serving(endpoint, third)["pid"] == third.pid
    finally:
        reap(first, [])
        if third is not None:
            reap(third, [])


def _journal_with_a_finished_job(path: Path) -> None:
    """Job 'old': 20 tasks, 19 done and one dead-lettered; job 'new' still runs."""
    book = TaskBook()

    def drive(event: Event) -> list[Any]:
        records, others = split_commands(book.handle(event, 1.0))
        journal.append(records)
        return others

    with Journal.open(path, create=True) as journal:
        drive(SubmitJob("old", [TaskSpec(f"o{i}", "k", i) for i in range(20)], JobPolicy(max_attempts=1)))
        drive(WorkerJoined("w", "n", Resources(20, 0), 20))
        for lease in [c for c in drive(RequestTask("w", 20)) if isinstance(c, Lease)]:
            if lease.task_id == "o5":
                drive(Fail("w", "o5", lease.lease_id, "ValueError: bad seed", "tb"))
            else:
                drive(Complete("w", lease.task_id, lease.lease_id, "r"))
        drive(SubmitJob("new", [TaskSpec("n0", "k", 0)]))


def test_master_compact_folds_finished_jobs_and_the_master_still_reports_them(
    tmp_path: Path,
) -> None:
    """`master compact` keeps the job's counts and its dead letter; a master serves them."""
    journal = tmp_path / "journal.db"
    _journal_with_a_finished_job(journal)
    out = ctl("master", "compact", "--journal", str(journal), timeout=60)
    assert out.returncode == 0, out.stderr
    assert "compacted 1 finished job(s)" in out.stdout and "19 task rows" in out.stdout
    conn = sqlite3.connect(journal)
    assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 2  # o5 (dead), n0
    conn.close()

    endpoint = free_endpoint()
    master = start_master(journal, endpoint, tmp_path / "logs")
    try:
        serving(endpoint, master)
        jobs = {j["job_id"]: j for j in anyio.run(master_call, endpoint, "jobs", None, 10.0)}
        dead = anyio.run(master_call, endpoint, "dead", {"job_id": "old"}, 10.0)
    finally:
        reap(master, [])
    assert (jobs["old"]["state"], jobs["old"]["total"]) == ("failed", 20)
    assert (jobs["old"]["counts"]["done"], jobs["old"]["counts"]["dead"]) == (19, 1)
    assert [(d["task_id"], d["error"]) for d in dead] == [("o5", "ValueError: bad seed")]


def test_a_journal_row_of_the_wrong_type_is_refused_at_start(tmp_path: Path) -> None:
    """`master start` on a journal with a text seed says which row, in one line, exit 2."""
    journal = tmp_path / "journal.db"
    _journal_with_a_finished_job(journal)
    conn = sqlite3.connect(journal)
    conn.execute("UPDATE tasks SET seed = 'abc' WHERE task_id = 'o7'")
    conn.commit()
    seq = conn.execute("SELECT seq FROM tasks WHERE task_id = 'o7'").fetchone()[0]
    conn.close()
    out = ctl(
        "master",
        "start",
        "--journal",
        str(journal),
        "--endpoint",
        free_endpoint(),
        "--logs",
        str(tmp_path / "logs"),
        timeout=60,
    )
    assert f"journal {journal}: tasks row {seq}: seed is 'abc' (text), expected an integer" in refusal(out)
