"""The SQLite task journal: durable records, strict opening, recovery after a kill."""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from troupe.runtime.errors import JournalError
from troupe.runtime.journal import Journal
from troupe.runtime.taskbook import TaskBook, split_commands
from troupe.runtime.taskstate import (
    Ack,
    AckOutcome,
    CancelJob,
    Command,
    Complete,
    Event,
    Fail,
    JobPolicy,
    JobState,
    Lease,
    Record,
    RequestTask,
    Resources,
    SubmitJob,
    TaskRecord,
    TaskSpec,
    TaskState,
    WorkerJoined,
)


def drive(book: TaskBook, journal: Journal, event: Event, now: float) -> list[Command]:
    """What the master's driver does: persist the records first, then hand back the rest."""
    records, others = split_commands(book.handle(event, now))
    journal.append(records)
    return others


def leases(commands: list[Command]) -> list[Lease]:
    return [c for c in commands if isinstance(c, Lease)]


def test_replay_restores_done_dead_cancelled_and_requeues_leased(tmp_path: Path) -> None:
    """After reopening, done/dead/cancelled tasks stay so, leased ones are pending again."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        tasks = [TaskSpec(f"t{i}", "render", 100 + i, {"scene": f"cas://{i}"},
                          Resources(0.5, 0), "n1" if i == 3 else None) for i in range(4)]
        drive(book, journal, SubmitJob("a", tasks, JobPolicy(max_attempts=1, lease_s=7)), 1.0)
        drive(book, journal, SubmitJob("b", [TaskSpec("b0", "k", 0)]), 2.0)
        drive(book, journal, WorkerJoined("w", "n1", Resources(8, 0), 8), 3.0)
        granted = leases(drive(book, journal, RequestTask("w", 3), 3.0))
        assert [g.task_id for g in granted] == ["t3", "t0", "t1"]  # locality first
        drive(book, journal, Complete("w", "t0", granted[1].lease_id, "out/t0"), 4.0)
        drive(book, journal, Fail("w", "t1", granted[2].lease_id, "ValueError: x", "tb"), 4.0)
        drive(book, journal, CancelJob("b"), 5.0)

    with Journal.open(path) as journal:
        back = journal.replay()
    assert [(t, back.task(t).state) for t in ("t0", "t1", "t2", "t3", "b0")] == [
        ("t0", TaskState.DONE), ("t1", TaskState.DEAD), ("t2", TaskState.PENDING),
        ("t3", TaskState.PENDING), ("b0", TaskState.CANCELLED),
    ]
    assert back.task("t0").result_ref == "out/t0"
    (dead,) = back.dead_letters("a")
    assert (dead.task_id, dead.attempts, dead.error, dead.traceback) == (
        "t1", 1, "ValueError: x", "tb")
    assert [(j.job_id, j.state, j.submitted_at) for j in back.jobs()] == [
        ("a", JobState.RUNNING, 1.0), ("b", JobState.CANCELLED, 2.0)]
    # specs and policy survive: the next lease carries the refs and the job's lease_s
    back.handle(WorkerJoined("w2", "n1", Resources(8, 0), 8), 10.0)
    again = leases(back.handle(RequestTask("w2", 2), 10.0))
    assert [g.task_id for g in again] == ["t3", "t2"]
    assert again[0].refs == {"scene": "cas://3"} and again[0].seed == 103
    assert again[0].deadline == 17.0 and again[0].attempt == 1
    assert min(g.lease_id for g in again) > max(g.lease_id for g in granted)


def test_old_lease_completing_after_a_restart_is_accepted_once(tmp_path: Path) -> None:
    """A worker's Complete for a lease issued before the restart commits the task, once."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    journal = Journal.open(path, create=True)
    drive(book, journal, SubmitJob("j", [TaskSpec("t", "k", 0)]), 0.0)
    drive(book, journal, WorkerJoined("w", "n", Resources(1, 0), 1), 0.0)
    (old,) = leases(drive(book, journal, RequestTask("w", 1), 0.0))
    journal.close()

    journal = Journal.open(path)
    back = journal.replay()
    out = drive(back, journal, Complete("w", "t", old.lease_id, "ref"), 5.0)
    assert out[0] == Ack("w", "t", old.lease_id, AckOutcome.COMMITTED)
    out = drive(back, journal, Complete("w", "t", old.lease_id, "ref"), 6.0)
    assert out == [Ack("w", "t", old.lease_id, AckOutcome.DUPLICATE)]
    journal.close()
    assert Journal.open(path).replay().task("t").state is TaskState.DONE


def test_dropping_the_journal_without_close_loses_nothing(tmp_path: Path) -> None:
    """A journal object dropped without close keeps every appended record."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    journal = Journal.open(path, create=True)
    drive(book, journal, SubmitJob("j", [TaskSpec(f"t{i}", "k", i) for i in range(5)]), 0.0)
    drive(book, journal, WorkerJoined("w", "n", Resources(4, 0), 4), 0.0)
    granted = leases(drive(book, journal, RequestTask("w", 4), 0.0))
    drive(book, journal, Complete("w", "t0", granted[0].lease_id, "r"), 1.0)
    del journal
    gc.collect()
    stats = Journal.open(path).replay().statistics()
    assert (stats.tasks[TaskState.DONE], stats.tasks[TaskState.PENDING]) == (1, 4)
    assert stats.tasks[TaskState.LEASED] == 0


KILLED_MASTER = """
import os, signal, sys
from troupe.runtime.journal import Journal
from troupe.runtime.taskbook import TaskBook, split_commands
from troupe.runtime.taskstate import *

book, journal = TaskBook(), Journal.open(sys.argv[1], create=True)
def drive(event, now):
    records, others = split_commands(book.handle(event, now))
    journal.append(records)
    return others
drive(SubmitJob("j", [TaskSpec(f"t{i:02d}", "k", i) for i in range(50)]), 0.0)
drive(WorkerJoined("w", "n", Resources(10, 0), 10), 0.0)
granted = [c for c in drive(RequestTask("w", 10), 1.0) if isinstance(c, Lease)]
for lease in granted[:5]:
    drive(Complete("w", lease.task_id, lease.lease_id, "r"), 2.0)
print("RUNNING", " ".join(f"{c.task_id}:{c.lease_id}" for c in granted[5:]), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_recovery_after_the_master_is_killed(tmp_path: Path) -> None:
    """A master killed by SIGKILL leaves a journal that replays done tasks and requeues leased."""
    path = tmp_path / "journal.db"
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED_MASTER), str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert child.returncode == -9, child.stderr
    (line,) = [line for line in child.stdout.splitlines() if line.startswith("RUNNING ")]
    running = dict(pair.split(":") for pair in line.split()[1:])
    assert len(running) == 5
    journal = Journal.open(path)
    book = journal.replay()
    stats = book.statistics()
    assert (stats.tasks[TaskState.DONE], stats.tasks[TaskState.PENDING]) == (5, 45)
    task_id, lease_id = next(iter(running.items()))
    out = drive(book, journal, Complete("w", task_id, int(lease_id), "r"), 3.0)
    assert out[0] == Ack("w", task_id, int(lease_id), AckOutcome.COMMITTED)
    journal.close()


def test_missing_file_raises_and_is_not_created(tmp_path: Path) -> None:
    """Opening a journal that does not exist, without create, raises and creates nothing."""
    path = tmp_path / "nope.db"
    with pytest.raises(JournalError, match="does not exist; .*create=True"):
        Journal.open(path)
    assert not path.exists()
    with pytest.raises(JournalError, match="directory"):
        Journal.open(tmp_path / "no" / "such" / "dir.db", create=True)


def test_random_bytes_raise_and_are_never_overwritten(tmp_path: Path) -> None:
    """A file of random bytes is refused, even with create=True, and left as it was."""
    path = tmp_path / "junk.db"
    junk = os.urandom(16384)
    path.write_bytes(junk)
    for create in (False, True):
        with pytest.raises(JournalError, match="not a"):
            Journal.open(path, create=create)
    assert path.read_bytes() == junk


def test_empty_file_is_refused_without_create(tmp_path: Path) -> None:
    """An empty file is no journal unless the caller asks to create one there."""
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(JournalError, match="empty file"):
        Journal.open(path)
    with Journal.open(path, create=True) as journal:
        assert journal.replay().jobs() == []


def test_sqlite_file_of_another_program_is_refused(tmp_path: Path) -> None:
    """A healthy SQLite database that is not a troupe journal is refused."""
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(JournalError, match="another program"):
        Journal.open(path, create=True)


def test_other_schema_version_is_refused(tmp_path: Path) -> None:
    """A journal written with another schema version is refused with the versions named."""
    path = tmp_path / "journal.db"
    Journal.open(path, create=True).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(JournalError, match="schema version 99, this troupe reads version 1"):
        Journal.open(path)


def test_corrupt_pages_are_refused(tmp_path: Path) -> None:
    """A journal whose pages were overwritten fails its check and is refused."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        tasks = [TaskSpec(f"task-{i:05d}", "k", i) for i in range(3000)]
        drive(book, journal, SubmitJob("j", tasks), 0.0)
    data = bytearray(path.read_bytes())
    assert len(data) > 16 * 4096
    data[4096 * 2: 4096 * 12] = b"\xa5" * (4096 * 10)  # page 1 intact: still looks like SQLite
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError, match="is corrupt .PRAGMA quick_check: .*restore it"):
        Journal.open(path)


def test_append_is_one_transaction(tmp_path: Path) -> None:
    """An append that fails part-way keeps none of its records."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        records, _ = split_commands(book.handle(SubmitJob("j", [TaskSpec("t", "k", 0)]), 0.0))
        stray = Record(TaskRecord("ghost", "j", TaskState.DONE, 0, 0.0, 0, None, None, None))
        with pytest.raises(JournalError, match="tasks the journal does not hold"):
            journal.append([*records, stray])
        assert journal.replay().jobs() == []
        journal.append(records)
        assert [j.job_id for j in journal.replay().jobs()] == ["j"]


def test_journal_is_in_wal_mode_and_refuses_use_after_close(tmp_path: Path) -> None:
    """The file is a WAL-mode troupe journal; a closed journal raises instead of failing later."""
    path = tmp_path / "journal.db"
    journal = Journal.open(path, create=True)
    journal.close()
    journal.close()
    with pytest.raises(JournalError, match="closed"):
        journal.append([])
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    policy = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
    conn.close()
    assert policy == 0


def test_policy_is_stored_as_readable_json(tmp_path: Path) -> None:
    """A job row keeps its whole policy, readable by other tools."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        drive(book, journal, SubmitJob("j", [TaskSpec("t", "k", 0)], JobPolicy(priority=4)), 0.0)
    conn = sqlite3.connect(path)
    (text,) = conn.execute("SELECT policy FROM jobs").fetchone()
    conn.close()
    assert json.loads(text)["priority"] == 4


def test_100k_tasks_submit_and_replay_in_seconds(tmp_path: Path) -> None:
    """Submitting, journaling and replaying 100,000 tasks takes a few seconds at most."""
    path = tmp_path / "journal.db"
    start = time.perf_counter()
    book = TaskBook()
    tasks = [TaskSpec(f"big-{i:06d}", "k", i) for i in range(100_000)]
    with Journal.open(path, create=True) as journal:
        drive(book, journal, SubmitJob("big", tasks), 0.0)
        drive(book, journal, WorkerJoined("w", "n", Resources(1000, 0), 1000), 0.0)
        granted = leases(drive(book, journal, RequestTask("w", 1000), 0.0))
        for lease in granted[:500]:
            drive(book, journal, Complete("w", lease.task_id, lease.lease_id, "r"), 1.0)
    with Journal.open(path) as journal:
        stats = journal.replay().statistics()
    elapsed = time.perf_counter() - start
    assert (stats.tasks[TaskState.DONE], stats.tasks[TaskState.PENDING]) == (500, 99_500)
    assert elapsed < 10.0, f"100k tasks took {elapsed:.1f}s"
