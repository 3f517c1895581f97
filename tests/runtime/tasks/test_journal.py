"""The SQLite task journal: durable records, strict opening, recovery after a kill."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from support.held_in_child import held_in_child
from support.journal_drive import drive, leases
from support.killed_journal import run_killed
from troupe.runtime.errors import JournalError, TaskError
from troupe.runtime.tasks import book_jobs
from troupe.runtime.tasks import journal as journal_mod
from troupe.runtime.tasks.book import TaskBook, split_commands
from troupe.runtime.tasks.journal import SCHEMA_VERSION, Compaction, Journal
from troupe.runtime.tasks.journal_lock import JournalBusy, JournalLock
from troupe.runtime.tasks.journal_rows import SELECT_TASKS, task_rows
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.state import (
    Ack,
    AckOutcome,
    CancelJob,
    CancelLease,
    Command,
    Complete,
    Fail,
    JobPolicy,
    JobRecord,
    JobState,
    JobTasksCancelled,
    Record,
    RequestTask,
    Resources,
    SchedulerTick,
    SubmitJob,
    TaskRecord,
    TaskSpec,
    TaskState,
    WorkerJoined,
)


def test_replay_restores_done_dead_cancelled_and_holds_leased_over(tmp_path: Path) -> None:
    """After reopening, done/dead/cancelled tasks stay so; a leased one stays leased for its
    holder for one lease_s, then goes back, no attempt counted, with its spec and policy."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        tasks = [
            TaskSpec(
                f"t{i}",
                "render",
                100 + i,
                {"scene": f"cas://{i}"},
                Resources(0.5, 0),
                "n1" if i == 3 else None,
            )
            for i in range(4)
        ]
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
        ("t0", TaskState.DONE),
        ("t1", TaskState.DEAD),
        ("t2", TaskState.PENDING),
        ("t3", TaskState.LEASED),
        ("b0", TaskState.CANCELLED),
    ]
    assert back.task("t0").result_ref == "out/t0"
    (dead,) = back.dead_letters("a")
    assert (dead.task_id, dead.attempts, dead.error, dead.traceback) == ("t1", 1, "ValueError: x", "tb")
    assert [(j.job_id, j.state, j.submitted_at) for j in back.jobs()] == [
        ("a", JobState.RUNNING, 1.0),
        ("b", JobState.CANCELLED, 2.0),
    ]
    # t3 waits for its holder (lease_s from the first event); specs and policy survive: the
    # next lease carries the refs and the job's lease_s
    back.handle(WorkerJoined("w2", "n1", Resources(8, 0), 8), 10.0)
    assert [g.task_id for g in leases(back.handle(RequestTask("w2", 2), 10.0))] == ["t2"]
    assert leases(back.handle(RequestTask("w2", 2), 16.9)) == []
    back.handle(SchedulerTick(), 17.0)  # nobody renewed lease granted[0] within 7 s
    again = leases(back.handle(RequestTask("w2", 2), 17.0))
    assert [g.task_id for g in again] == ["t3"]
    assert again[0].refs == {"scene": "cas://3"} and again[0].seed == 103
    assert again[0].deadline == 24.0 and again[0].attempt == 1
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
    assert (stats.tasks[TaskState.DONE], stats.tasks[TaskState.PENDING]) == (1, 1)
    assert stats.tasks[TaskState.LEASED] == 3  # held over for their holders


KILLED_MASTER = """
import os, signal, sys
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.book import TaskBook, split_commands
from troupe.runtime.tasks.state import *

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
    """A master killed by SIGKILL leaves a journal that replays done tasks and holds leased
    ones over for their holders, whose Complete commits."""
    path = tmp_path / "journal.db"
    child = run_killed(KILLED_MASTER, path)
    (line,) = [line for line in child.stdout.splitlines() if line.startswith("RUNNING ")]
    running = dict(pair.split(":") for pair in line.split()[1:])
    assert len(running) == 5
    journal = Journal.open(path)
    book = journal.replay()
    stats = book.statistics()
    assert (stats.tasks[TaskState.DONE], stats.tasks[TaskState.LEASED]) == (5, 5)
    assert stats.tasks[TaskState.PENDING] == 40
    task_id, lease_id = next(iter(running.items()))
    out = drive(book, journal, Complete("w", task_id, int(lease_id), "r"), 3.0)
    assert out[0] == Ack("w", task_id, int(lease_id), AckOutcome.COMMITTED)
    journal.close()


def test_missing_file_raises_and_is_not_created(tmp_path: Path) -> None:
    """Opening a journal that does not exist, without create, raises and creates nothing."""
    path = tmp_path / "nope.db"
    with pytest.raises(JournalError, match=r"does not exist; .*create=True"):
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


def test_an_emptied_journal_is_refused_and_its_wal_kept(tmp_path: Path) -> None:
    """A journal emptied after its master was killed is refused, with or without --new, and its
    -wal and -shm files (which may hold every record) are left as they were."""
    path = tmp_path / "journal.db"
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED_MASTER), str(path)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -9, child.stderr
    path.write_bytes(b"")
    sidecars = [tmp_path / "journal.db-wal", tmp_path / "journal.db-shm"]
    before = [side.read_bytes() for side in sidecars]
    assert before[0]
    for new in (False, True):
        with pytest.raises(
            JournalError, match=r"empty file beside a \d+-byte journal.db-wal .*nothing was changed"
        ):
            open_journal(path, new=new)
    assert [side.read_bytes() for side in sidecars] == before
    assert path.read_bytes() == b""


def test_the_master_s_refusal_of_an_empty_file_names_new(tmp_path: Path) -> None:
    """The master (the CLI) is told to pass --new, not the Python API's create=True; a device
    such as /dev/null is refused as no regular file."""
    path = tmp_path / "journal.db"
    path.touch()
    with pytest.raises(JournalError, match="is an empty file, not a troupe journal; pass --new") as refused:
        open_journal(path)
    assert "create=True" not in str(refused.value)
    with pytest.raises(JournalError, match="journal /dev/null is not a regular file"):
        open_journal("/dev/null", new=True)


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
    with pytest.raises(JournalError, match="schema version 99, this troupe reads versions 1 to 4"):
        Journal.open(path)


@pytest.mark.parametrize(
    "kept", [None, "journal.db.v3.20261207T101500Z.bak", "journal.db.v4.20261207T101500Z.bak"]
)
def test_a_newer_troupe_s_journal_names_the_copy_its_upgrade_kept(tmp_path: Path, kept: str | None) -> None:
    """mv 2: a newer troupe's journal was refused with "open it with the troupe release that wrote
    it", which named nothing (every checkout says ``troupe 0.1.0``), and not the copy the newer
    troupe's upgrade kept beside it, which this troupe reads: it is named, with what putting it
    back costs."""
    path = tmp_path / "journal.db"
    Journal.open(path, create=True).close()
    (tmp_path / "journal.db.v9.20261207T101500Z.bak").write_bytes(b"")  # a copy this troupe cannot read
    if kept is not None:
        (tmp_path / kept).write_bytes(path.read_bytes())
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(JournalError) as refused:
        Journal.open(path)
    said = str(refused.value)
    assert "a newer troupe wrote it" in said and "troupe --version" in said and "release" not in said
    if kept is None:
        assert ".bak" not in said and "start a new journal" in said
    else:
        assert f"put back the copy its upgrade kept, {kept}, as journal.db" in said
        assert "what was journaled since is lost" in said


def _written_then_killed(path: Path, statements: list[str]) -> None:
    """Run ``statements`` on the database at ``path`` in WAL mode, in a process that then dies
    without closing it: what they wrote stays in ``<path>-wal``, as a crashed program leaves it."""
    code = textwrap.dedent(
        f"""
        import os, sqlite3
        conn = sqlite3.connect({str(path)!r}, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        for statement in {statements!r}:
            conn.execute(statement)
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _database_files(path: Path) -> dict[str, bytes]:
    """Every file beside the database but its ``-shm`` (the WAL's index, which readers rebuild)."""
    return {p.name: p.read_bytes() for p in sorted(path.parent.iterdir()) if not p.name.endswith("-shm")}


@pytest.mark.parametrize("whose", ["another program's", "another schema version's"])
def test_a_refused_database_is_left_as_it_was_its_wal_too(tmp_path: Path, whose: str) -> None:
    """A database refused as no journal of this troupe keeps its files byte for byte: the
    ``-wal`` its program left is neither folded into it nor deleted, and no lock file is left
    beside it (a read-write open folded and deleted that WAL as it closed)."""
    path = tmp_path / "some.db"
    if whose == "another program's":
        _written_then_killed(path, ["CREATE TABLE t (x)", "INSERT INTO t VALUES (1)"])
        refusal = "another program"
    else:
        Journal.open(path, create=True).close()
        _written_then_killed(path, ["PRAGMA user_version = 99"])
        refusal = "schema version 99"
    assert (tmp_path / "some.db-wal").stat().st_size > 0
    before = _database_files(path)
    with pytest.raises(JournalError, match=f"{refusal}.*nothing was changed"):
        open_journal(path)
    assert _database_files(path) == before


def test_corrupt_pages_are_refused(tmp_path: Path) -> None:
    """A journal whose pages were overwritten fails its check and is refused."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        tasks = [TaskSpec(f"task-{i:05d}", "k", i) for i in range(3000)]
        drive(book, journal, SubmitJob("j", tasks), 0.0)
    data = bytearray(path.read_bytes())
    assert len(data) > 16 * 4096
    data[4096 * 2 : 4096 * 12] = b"\xa5" * (4096 * 10)  # page 1 intact: still looks like SQLite
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError, match=r"is corrupt .PRAGMA quick_check: .*restore it"):
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


def test_100k_tasks_submit_and_replay(tmp_path: Path) -> None:
    """100,000 tasks are submitted, journaled and replayed with every state intact."""
    path = tmp_path / "journal.db"
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
    assert (stats.tasks[TaskState.DONE], stats.tasks[TaskState.PENDING]) == (500, 99_000)
    assert stats.tasks[TaskState.LEASED] == 500  # held over for their holders


def test_a_long_replay_says_how_far_it_got(tmp_path: Path) -> None:
    """A replay past its note interval logs the tasks read so far, of how many, and the total."""
    path = tmp_path / "journal.db"
    with Journal.open(path, create=True) as journal:
        drive(TaskBook(), journal, SubmitJob("j", [TaskSpec(f"t{i:05d}", "k", i) for i in range(3000)]), 0.0)
    with Journal.open(path) as journal, structlog.testing.capture_logs() as logs:
        journal.replay(note_s=0.0)  # every 1,024 rows: the note is due at each look
    notes = [(e["tasks"], e["of"]) for e in logs if e["event"] == "journal_replaying"]
    assert notes == [(1024, 3000), (2048, 3000)]
    (done,) = [e for e in logs if e["event"] == "journal_replayed"]
    assert done["tasks"] == 3000 and done["took_s"] >= 0.0


# ---------------------------------------------------------------- one master per journal


def test_a_held_journal_is_refused_until_it_is_closed(tmp_path: Path) -> None:
    """A second open of a journal in use is refused, naming the holder's pid; close frees it."""
    path = tmp_path / "journal.db"
    first = Journal.open(path, create=True)
    with pytest.raises(
        JournalBusy,
        match=f"journal {path} is held by another master "
        rf"\(pid {os.getpid()}\)",
    ):
        Journal.open(path)
    with pytest.raises(JournalBusy):
        open_journal(path, new=True)
    first.close()
    with Journal.open(path) as again:
        assert again.replay().jobs() == []


def test_a_symlink_to_a_held_journal_is_refused(tmp_path: Path) -> None:
    """A symlink to a journal, or to its folder, takes the journal's own lock: it is refused too."""
    path = tmp_path / "journal.db"
    link = tmp_path / "jlink.db"
    link.symlink_to(path)
    folder_link = tmp_path / "folder"
    folder_link.symlink_to(tmp_path)
    with Journal.open(path, create=True):
        for other in (link, folder_link / "journal.db"):
            with pytest.raises(
                JournalBusy, match=rf"journal {other} is held by another master \(pid {os.getpid()}\)"
            ):
                Journal.open(other)
    with Journal.open(link) as again:
        assert again.replay().jobs() == []


def test_a_lock_handed_to_open_is_taken_over_and_kept_where_the_open_is_refused(tmp_path: Path) -> None:
    """A caller that holds the journal already (a one-host run, from its checks on) hands its
    lock over: the journal's close frees it; an open refused, even once the file was open
    (a bad row found as it was read back), leaves it held; another journal's lock is refused."""
    path = tmp_path / "journal.db"
    _submit_and_finish(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE tasks SET seed = 'abc' WHERE seq = 2")
    conn.commit()
    conn.close()
    lock = JournalLock.acquire(path)
    with pytest.raises(JournalError, match="seed is 'abc'"):
        open_journal(path, lock=lock)
    assert lock.held
    other = JournalLock.acquire(tmp_path / "other.db")
    with pytest.raises(ValueError, match="not its own"):
        Journal.open(path, lock=other)
    other.release()
    journal = Journal.open(path, lock=lock)
    with pytest.raises(JournalBusy):
        JournalLock.acquire(path)
    journal.close()
    assert not lock.held
    JournalLock.acquire(path).release()


def test_a_hard_link_to_a_held_journal_is_refused(tmp_path: Path) -> None:
    """A hard link has a name, and a lock file, of its own: the lock of the file itself refuses
    it, naming the holder, whether the journal existed as the lock was taken or was made by the
    open; let go, the link opens the same journal. (In one process SQLite itself refuses a
    second connection through the link, as a disk I/O error, before the lock is asked: the lock
    is asked directly here; another process's master is below.)"""
    path = tmp_path / "journal.db"
    (tmp_path / "elsewhere").mkdir()
    hard = tmp_path / "elsewhere" / "hard.db"
    busy = rf"journal {hard} is held by another master \(pid {os.getpid()}\)"
    with Journal.open(path, create=True):  # made by this open: covered once SQLite made it
        os.link(path, hard)
        with pytest.raises(JournalBusy, match=busy):
            JournalLock.acquire(hard)
    first = JournalLock.acquire(path)  # the file exists: covered as the lock is taken
    try:
        with pytest.raises(JournalBusy, match=busy):
            JournalLock.acquire(hard)
    finally:
        first.release()
    with Journal.open(hard) as again:
        assert again.replay().jobs() == []
        with pytest.raises(
            JournalBusy, match=rf"journal {path} is held by another master \(pid {os.getpid()}\)"
        ):
            JournalLock.acquire(path)
    JournalLock.acquire(path).release()


def test_a_hard_link_to_a_journal_another_process_holds_names_its_pid(tmp_path: Path) -> None:
    """The holder is another process: its pid is found by the file's lock, not by the lock file
    of the name it used (the link's own names nobody)."""
    path = tmp_path / "journal.db"
    Journal.open(path, create=True).close()
    hard = tmp_path / "hard.db"
    os.link(path, hard)
    code = (
        "import sys\n"
        "from troupe.runtime.tasks.journal import Journal\n"
        "journal = Journal.open(sys.argv[1])\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
        "journal.close()\n"
    )
    with (
        held_in_child(code, str(path)) as holder,
        pytest.raises(JournalBusy, match=rf"journal {hard} is held by another master \(pid {holder.pid}\)"),
    ):
        Journal.open(hard)
    assert holder.returncode == 0
    Journal.open(hard).close()


def test_a_dropped_journal_frees_its_lock(tmp_path: Path) -> None:
    """A journal object dropped without close does not keep its journal locked."""
    path = tmp_path / "journal.db"
    journal = Journal.open(path, create=True)
    del journal
    gc.collect()
    Journal.open(path).close()


# ---------------------------------------------------------------- replay checks every row


def _submit_and_finish(path: Path) -> None:
    """A journal with one job of three tasks: one done, two pending."""
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        drive(
            book,
            journal,
            SubmitJob("j", [TaskSpec(f"t{i}", "k", i, {"scene": "cas://x"}) for i in range(3)]),
            0.0,
        )
        drive(book, journal, WorkerJoined("w", "n", Resources(1, 0), 1), 0.0)
        (lease,) = leases(drive(book, journal, RequestTask("w", 1), 0.0))
        drive(book, journal, Complete("w", lease.task_id, lease.lease_id, "r"), 1.0)


def _dump(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        rows = [("jobs", *r) for r in conn.execute("SELECT rowid, * FROM jobs ORDER BY rowid")]
        return rows + [("tasks", *r) for r in conn.execute("SELECT * FROM tasks ORDER BY seq")]
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "UPDATE tasks SET seed = 'abc' WHERE seq = 2",
            "tasks row 2: seed is 'abc' (text), expected an integer",
        ),
        (
            "UPDATE tasks SET attempts = 1.5 WHERE seq = 3",
            "tasks row 3: attempts is 1.5 (real), expected an integer >= 0",
        ),
        (
            "UPDATE tasks SET attempts = -1 WHERE seq = 1",
            "tasks row 1: attempts is -1 (integer), expected an integer >= 0",
        ),
        (
            "UPDATE tasks SET state = 'zombie' WHERE seq = 1",
            "tasks row 1: state is 'zombie' (text), expected one of pending, ",
        ),
        (
            "UPDATE tasks SET refs = '{not json' WHERE seq = 3",
            "tasks row 3: refs is '{not json' (text), expected a JSON object of texts",
        ),
        (
            "UPDATE tasks SET refs = '{\"scene\": 7}' WHERE seq = 1",
            "tasks row 1: refs is '{\"scene\": 7}' (text), expected a JSON object of texts",
        ),
        (
            "UPDATE tasks SET cpu = x'00' WHERE seq = 2",
            "tasks row 2: cpu is b'\\x00' (blob), expected a number >= 0",
        ),
        (
            "UPDATE jobs SET submitted_at = 'yesterday'",
            "jobs row 1: submitted_at is 'yesterday' (text), expected a number",
        ),
        (
            "UPDATE jobs SET policy = '{\"priority\": 1}'",
            "jobs row 1: policy is '{\"priority\": 1}' (text), expected a job policy",
        ),
    ],
)
def test_a_row_of_the_wrong_type_is_refused_naming_it(tmp_path: Path, sql: str, message: str) -> None:
    """Replay checks every row: a bad value is named (table, row, column, value); no change."""
    path = tmp_path / "journal.db"
    _submit_and_finish(path)
    conn = sqlite3.connect(path)
    conn.execute(sql)
    conn.commit()
    conn.close()
    before = _dump(path)
    with Journal.open(path) as journal:
        with pytest.raises(JournalError) as info:
            journal.replay()
        with pytest.raises(JournalError, match="row"):
            journal.compact(time.time())  # compaction refuses it too, before writing anything
    assert f"journal {path}: {message}" in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(JournalError, match=re.escape(message)):
        open_journal(path)  # the master's path: refused before compacting or replaying
    assert _dump(path) == before


def test_a_version_1_journal_is_upgraded_and_replayed(tmp_path: Path) -> None:
    """A journal of schema version 1 opens: it gains the version-2 columns, its rows replay."""
    path = _version_1_journal(tmp_path)
    with Journal.open(path) as journal:
        book = journal.replay()
        assert book.task("t0").state is TaskState.DONE
        assert journal.compact(time.time() - 60).jobs == 0  # "finished" counts from the upgrade
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("SELECT finished_at FROM jobs").fetchone()[0] is not None
    conn.close()


def _version_1_journal(tmp_path: Path) -> Path:
    """A journal of schema version 1 with a job 'old' done, of one task 't0'."""
    path = tmp_path / "journal.db"
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    conn.execute(
        "INSERT INTO jobs VALUES ('old', 'old', 0, 'done', ?, 5.0)",
        (json.dumps(dataclasses.asdict(JobPolicy())),),
    )
    conn.execute(
        "INSERT INTO tasks VALUES (0, 't0', 'old', 'k', 3, '{}', 1.0, 0, NULL, 'done',"
        " 1, 0.0, 1, 'r', NULL, NULL)"
    )
    conn.commit()
    conn.close()
    return path


V1_SCHEMA = """
PRAGMA application_id = 1414681936;
PRAGMA user_version = 1;
PRAGMA journal_mode = WAL;
CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL, seq INTEGER NOT NULL,
    state TEXT NOT NULL, policy TEXT NOT NULL, submitted_at REAL NOT NULL);
CREATE TABLE tasks (seq INTEGER PRIMARY KEY, task_id TEXT NOT NULL UNIQUE,
    job_id TEXT NOT NULL REFERENCES jobs (job_id), kind TEXT NOT NULL, seed INTEGER NOT NULL,
    refs TEXT NOT NULL, cpu REAL NOT NULL, gpu INTEGER NOT NULL, locality TEXT,
    state TEXT NOT NULL, attempts INTEGER NOT NULL, not_before REAL NOT NULL,
    last_lease_id INTEGER NOT NULL, result_ref TEXT, error TEXT, traceback TEXT);
"""


# ---------------------------------------------------------------- compaction


def _three_jobs(journal: Journal) -> TaskBook:
    """'mixed' ends failed (8 done, 2 dead), 'stopped' is cancelled, 'live' still runs."""
    book = TaskBook()
    drive(
        book,
        journal,
        SubmitJob("mixed", [TaskSpec(f"m{i}", "k", i) for i in range(10)], JobPolicy(max_attempts=1)),
        0.0,
    )
    drive(book, journal, SubmitJob("stopped", [TaskSpec(f"s{i}", "k", i) for i in range(5)]), 0.0)
    drive(book, journal, CancelJob("stopped"), 0.0)
    drive(book, journal, WorkerJoined("w", "n", Resources(10, 0), 10), 0.0)
    for lease in leases(drive(book, journal, RequestTask("w", 10), 1.0)):
        if lease.task_id in ("m3", "m7"):
            drive(book, journal, Fail("w", lease.task_id, lease.lease_id, "boom", "tb"), 2.0)
        else:
            drive(book, journal, Complete("w", lease.task_id, lease.lease_id, "r"), 2.0)
    drive(book, journal, SubmitJob("live", [TaskSpec(f"l{i}", "k", i) for i in range(4)]), 3.0)
    return book


def _summaries(book: TaskBook) -> list[tuple[object, ...]]:
    return [(j.job_id, j.state, j.total, dict(j.counts)) for j in book.jobs()]


def test_compaction_keeps_counts_and_dead_letters_and_replays_only_summaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finished jobs fold into counts: same jobs, counts and dead letters; far fewer rows read."""
    path = tmp_path / "journal.db"
    with Journal.open(path, create=True) as journal:
        live_book = _three_jobs(journal)
        assert [j.state for j in live_book.jobs()] == [JobState.FAILED, JobState.CANCELLED, JobState.RUNNING]
        assert journal.compact(time.time()) == Compaction(jobs=2, task_rows=13)
        assert journal.compact(time.time()) == Compaction(jobs=0, task_rows=0)  # idempotent

    read: list[str] = []
    real_rows = journal_mod.task_rows

    def counting(rows: Any) -> Any:
        for spec, record in real_rows(rows):
            read.append(spec.task_id)
            yield spec, record

    monkeypatch.setattr(journal_mod, "task_rows", counting)
    with Journal.open(path) as journal:
        book = journal.replay()
    # only the dead letters of the finished jobs are still task rows; the running job is whole
    assert sorted(read) == ["l0", "l1", "l2", "l3", "m3", "m7"]
    assert _summaries(book) == _summaries(live_book)
    assert book.statistics().tasks == live_book.statistics().tasks
    assert [(d.task_id, d.error, d.traceback) for d in book.dead_letters("mixed")] == [
        ("m3", "boom", "tb"),
        ("m7", "boom", "tb"),
    ]
    # a compacted done task is forgotten: a late report of it is rejected, nothing changes
    out = book.handle(Complete("w", "m0", 1, "r"), 5.0)
    assert [type(c).__name__ for c in out] == ["Reject"]
    with pytest.raises(TaskError, match="unknown task 'm0'"):
        book.task("m0")
    # the running job is untouched; its leases go on above every id issued (m0..m9: 1..10)
    book.handle(WorkerJoined("w2", "n", Resources(4, 0), 4), 6.0)
    granted = leases(book.handle(RequestTask("w2", 4), 6.0))
    assert sorted(g.task_id for g in granted) == ["l0", "l1", "l2", "l3"]
    assert min(g.lease_id for g in granted) == 11


def test_compaction_spares_jobs_finished_recently_and_running_ones(tmp_path: Path) -> None:
    """Only jobs finished at or before the given time are compacted; running ones never."""
    path = tmp_path / "journal.db"
    with Journal.open(path, create=True) as journal:
        _three_jobs(journal)
        assert journal.compact(time.time() - 3600) == Compaction(jobs=0, task_rows=0)
    journal, book = open_journal(path)  # the master's default: an hour
    journal.close()
    assert len(book.jobs()) == 3 and book.task("m0").state is TaskState.DONE
    journal, book = open_journal(path, compact_after_s=0.0)
    journal.close()
    with pytest.raises(TaskError):
        book.task("m0")
    assert [(j.job_id, j.total) for j in book.jobs()] == [("mixed", 10), ("stopped", 5), ("live", 4)]


def test_staged_records_are_durable_only_once_committed(tmp_path: Path) -> None:
    """The driver's two halves of an append: rows staged (no fsync yet) are not in the journal
    until ``commit``; ``rollback`` drops them; a stage that fails keeps nothing and leaves the
    journal usable."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    journal = Journal.open(path, create=True)
    try:
        drive(book, journal, WorkerJoined("w", "n", Resources(), 1), 0.0)
        drive(book, journal, SubmitJob("j", [TaskSpec("j-0", "k", 0), TaskSpec("j-1", "k", 1)]), 0.0)
        leased, _ = split_commands(book.handle(RequestTask("w", 1), 1.0))
        reader = sqlite3.connect(path)

        def state() -> str:
            return str(reader.execute("SELECT state FROM tasks WHERE task_id = 'j-0'").fetchone()[0])

        assert journal.stage(leased) and state() == "pending"  # staged: not in the journal yet
        journal.rollback()
        assert not journal.stage([]) and state() == "pending"
        assert journal.stage(leased)
        journal.commit()
        assert state() == "leased"
        reader.close()
        with pytest.raises(JournalError, match="journal does not hold"):
            journal.stage([TaskRecord("nope", "j", TaskState.DONE, 1, 0.0, 1, None, None, None)])
        assert journal.stage(leased)  # nothing of the failed stage stays open
        journal.commit()
    finally:
        journal.close()
    with Journal.open(path) as reopened:
        states = {t: reopened.replay().task(t).attempts for t in ("j-0", "j-1")}
        rows = dict(
            sqlite3.connect(path).execute("SELECT task_id, state FROM tasks ORDER BY task_id").fetchall()
        )
    assert rows == {"j-0": "leased", "j-1": "pending"} and states == {"j-0": 0, "j-1": 0}


def test_a_journal_whose_folder_is_a_file_says_so(tmp_path: Path) -> None:
    """It said the folder "does not exist; create it first", of a path that existed."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(JournalError, match=r"afile is a file, not a directory"):
        Journal.open(tmp_path / "afile" / "j.db", create=True)
    with pytest.raises(JournalError, match=r"nowhere does not exist; create it first"):
        Journal.open(tmp_path / "nowhere" / "j.db", create=True)


def _cancel_a_job_among_others(
    path: Path, bulk_from: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[TaskBook, list[Command]]:
    """Jobs b, a, c; in a: one task done, one dead, one leased, three pending; then a is
    cancelled, its live tasks in one record when there are ``bulk_from`` or more."""
    monkeypatch.setattr(book_jobs, "BULK_TASKS", bulk_from)
    book = TaskBook()
    with Journal.open(path, create=True) as journal:
        drive(book, journal, SubmitJob("b", [TaskSpec(f"b{i}", "k", i) for i in range(2)]), 1.0)
        drive(
            book,
            journal,
            SubmitJob("a", [TaskSpec(f"a{i}", "k", i) for i in range(6)], JobPolicy(max_attempts=1)),
            1.0,
        )
        drive(book, journal, SubmitJob("c", [TaskSpec(f"c{i}", "k", i) for i in range(2)]), 1.0)
        drive(book, journal, WorkerJoined("w", "n1", Resources(8, 0), 8), 2.0)
        granted = {g.task_id: g for g in leases(drive(book, journal, RequestTask("w", 5), 2.0))}
        drive(book, journal, Complete("w", "b0", granted["b0"].lease_id, "out/b0"), 3.0)
        drive(book, journal, Complete("w", "a0", granted["a0"].lease_id, "out/a0"), 3.0)
        drive(book, journal, Fail("w", "a1", granted["a1"].lease_id, "ValueError: x", "tb"), 3.0)
        records, others = split_commands(book.handle(CancelJob("a"), 4.0))
        journal.append(records)
        return book, [*records, *others]


@pytest.mark.parametrize("bulk_from", [4, 1000], ids=["one-record", "a-record-per-task"])
def test_a_cancelled_job_s_tasks_replay_cancelled_and_no_other_job_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bulk_from: int
) -> None:
    """A big job's cancel is one journal record (a record per task held the master's loop for
    seconds): after a restart its live tasks are cancelled, its done and dead ones stay so, and
    the jobs around it are untouched, as with a record per task; the leased copy is stopped."""
    path = tmp_path / "journal.db"
    book, commands = _cancel_a_job_among_others(path, bulk_from, monkeypatch)
    assert [c.task_id for c in commands if isinstance(c, CancelLease)] == ["a2"]
    tasks_records = [
        c.entry for c in commands if isinstance(c, Record) and not isinstance(c.entry, JobRecord)
    ]
    if bulk_from == 4:
        assert tasks_records == [JobTasksCancelled("a", "a0", "a5", 4)]
    else:
        assert len(tasks_records) == 4
    with Journal.open(path) as journal:
        back = journal.replay()
    states = {t: back.task(t).state for t in [*(f"a{i}" for i in range(6)), "b0", "b1", "c0", "c1"]}
    assert states == {
        "a0": TaskState.DONE,
        "a1": TaskState.DEAD,
        **{f"a{i}": TaskState.CANCELLED for i in range(2, 6)},
        "b0": TaskState.DONE,
        "b1": TaskState.LEASED,  # held over for its holder
        "c0": TaskState.PENDING,
        "c1": TaskState.PENDING,
    }
    assert back.statistics().jobs["a"] == book.statistics().jobs["a"]  # the live book's counts
    assert {j.job_id: j.state for j in back.jobs()}["a"] is JobState.CANCELLED


def test_an_upgrade_keeps_the_journal_as_it_was_for_an_older_master(tmp_path: Path) -> None:
    """A master upgrade was a one-way door: the older master refuses the upgraded journal.
    The journal as it was lies beside it, readable by the troupe that wrote it."""
    path = _version_1_journal(tmp_path)
    with Journal.open(path) as journal:
        journal.replay()
    [kept] = tmp_path.glob("journal.db.v1.*.bak")
    copy = sqlite3.connect(kept)
    try:
        assert copy.execute("PRAGMA user_version").fetchone()[0] == 1
        assert copy.execute("SELECT job_id FROM jobs").fetchall() == [("old",)]
    finally:
        copy.close()
    assert not list(tmp_path.glob("*.partial"))


def test_an_upgrade_after_a_rollback_keeps_a_new_copy_beside_the_first(tmp_path: Path) -> None:
    """Rolled back (the copy put in place), the older master journals on; upgraded again, the
    copy must hold that too. It kept the first copy, said it had made one, and a second
    rollback lost what the older master had journaled in between."""
    path = _version_1_journal(tmp_path)
    with Journal.open(path):
        pass
    [first] = tmp_path.glob("journal.db.v1.*.bak")
    for leftover in tmp_path.glob("journal.db-*"):
        leftover.unlink()
    shutil.copyfile(first, path)  # the rollback, as README says it
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO jobs VALUES ('after-rollback', 'after-rollback', 1, 'done', ?, 6.0)",
        (json.dumps(dataclasses.asdict(JobPolicy())),),
    )
    conn.commit()
    conn.close()
    with Journal.open(path):
        pass
    copies = sorted(tmp_path.glob("journal.db.v1.*.bak"))
    assert len(copies) == 2 and first in copies
    [second] = [c for c in copies if c != first]
    jobs = {}
    for copy_path in (first, second):
        copy = sqlite3.connect(copy_path)
        try:
            jobs[copy_path] = {row[0] for row in copy.execute("SELECT job_id FROM jobs")}
        finally:
            copy.close()
    assert jobs[first] == {"old"} and jobs[second] == {"old", "after-rollback"}


def test_an_upgrade_whose_copy_cannot_be_written_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _version_1_journal(tmp_path)

    def disk_full(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("troupe.runtime.tasks.journal_backup.os.replace", disk_full)
    with pytest.raises(JournalError, match=r"could not be written.*nothing was changed"):
        Journal.open(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1  # not upgraded
    finally:
        conn.close()
    assert [p.name for p in tmp_path.iterdir() if ".bak" in p.name] == []


def test_replayed_tasks_share_what_their_submit_shared(tmp_path: Path) -> None:
    """Each replayed row had its own job id, kind and refs objects, about 100 bytes a task more
    than the submit: a master that had just accepted 2 million tasks was killed by its memory
    limit as it read them back on a restart (report rs 5)."""
    path = tmp_path / "journal.db"
    refs = {"scene": "store://scenes/a"}
    tasks = [TaskSpec(f"t{i:05d}", "render", i, refs) for i in range(300)]
    tasks += [TaskSpec(f"u{i:05d}", "plan", i) for i in range(300)]
    with Journal.open(path, create=True) as journal:
        drive(TaskBook(), journal, SubmitJob("scenes", tasks), 0.0)
    conn = sqlite3.connect(path)
    try:
        rows = list(task_rows(conn.execute(SELECT_TASKS)))
    finally:
        conn.close()
    render = [spec for spec, _ in rows if spec.kind == "render"]
    plan = [spec for spec, _ in rows if spec.kind == "plan"]
    assert len(render) == len(plan) == 300 and all(spec.refs == refs for spec in render)
    assert len({id(spec.refs) for spec in render}) == 1 and len({id(spec.refs) for spec in plan}) == 1
    assert len({id(spec.kind) for spec in render}) == 1
    assert len({id(record.job_id) for _, record in rows}) == 1
