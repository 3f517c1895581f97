"""A big job's task rows: written by the commit, in order, exactly as row by row, or not at all."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from troupe.runtime.errors import JournalError
from troupe.runtime.tasks.book import TaskBook, split_commands
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.journal_bulk import BULK_TASKS, CHUNK_TASKS, insert_tasks
from troupe.runtime.tasks.state import (
    Lease,
    Record,
    RequestTask,
    Resources,
    SubmitJob,
    TaskSpec,
    TaskState,
    WorkerJoined,
)

INT64 = (-(2**63), 2**63 - 1)


def varied(n: int, prefix: str = "t") -> list[TaskSpec]:
    """Tasks with every column's awkward values: extreme seeds, nested refs, fractions of a
    CPU, GPUs, localities or none, ids and kinds beyond ASCII."""
    return [
        TaskSpec(
            f"{prefix}-é{i:06d}",
            "kïnd-" + str(i % 3),
            INT64[i % 2] if i % 7 == 0 else i - n // 2,
            refs={"scene": f"sha256:{i:064x}", "quote": 'a "b" \\ c'} if i % 4 == 0 else {},
            needs=Resources(0.25 * (i % 5), i % 2),
            locality=f"node-{i % 3}" if i % 3 else None,
        )
        for i in range(n)
    ]


def runs_and_odd_ones(prefix: str = "t") -> list[TaskSpec]:
    """Runs of alike tasks (as a ``count`` job makes: one refs mapping, one needs), one longer
    than a chunk, between tasks that each differ from the next."""
    refs, needs = {"scene": "sha256:ab"}, Resources(0.5, 1)
    odd = varied(2 * CHUNK_TASKS + 70, prefix)

    def run(start: int, n: int, locality: str | None) -> list[TaskSpec]:
        return [
            TaskSpec(f"{prefix}-run{i:06d}", "run", i - 5, refs, needs, locality)
            for i in range(start, start + n)
        ]

    return [
        *run(0, 100, None),
        *odd[:5],
        *run(100, CHUNK_TASKS + 10, "node-1"),
        *odd[5:70],  # a "run" of one each, many of them: rows, in more than one chunk
        *run(CHUNK_TASKS + 110, 64, None),
        *odd[70:],
    ]


def rows(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        out = conn.execute("SELECT * FROM tasks ORDER BY seq").fetchall()
        return [tuple(r) + tuple(type(v).__name__ for v in r) for r in out]  # values and types
    finally:
        conn.close()


def test_bulk_rows_equal_row_by_row_rows_in_value_type_and_order(tmp_path: Path) -> None:
    """The same tasks journaled as a big job (chunks of JSON) and as small jobs (one row each)
    give the same rows, with the same SQLite types, in the same order."""
    tasks = runs_and_odd_ones()
    assert len(tasks) >= BULK_TASKS
    with Journal.open(tmp_path / "bulk.db", create=True) as journal:
        records, _ = split_commands(TaskBook().handle(SubmitJob("j", tasks), 0.0))
        journal.append(records)
    with Journal.open(tmp_path / "rows.db", create=True) as journal:
        book = TaskBook()
        records, _ = split_commands(book.handle(SubmitJob("j", tasks[:1]), 0.0))
        journal.append(records)
        journal._connection().executemany(  # the rest as the small-job path writes them
            "INSERT INTO tasks (task_id, job_id, kind, seed, refs, cpu, gpu, locality, state, "
            "attempts, not_before, last_lease_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, 0.0, 0)",
            _spec_rows(tasks[1:]),
        )
    assert rows(tmp_path / "bulk.db") == rows(tmp_path / "rows.db")
    with Journal.open(tmp_path / "bulk.db") as journal:  # every row passes replay's checks
        assert journal.replay().statistics().tasks[TaskState.PENDING] == len(tasks)


def _spec_rows(tasks: list[TaskSpec]) -> list[tuple[object, ...]]:
    from troupe.runtime.tasks.journal_write import spec_rows as journal_rows

    return list(journal_rows("j", tasks))


def test_a_big_job_s_rows_and_what_follows_them_wait_for_the_commit(tmp_path: Path) -> None:
    """Staging writes what comes before a big job; its rows and a later lease of one of its
    tasks are written by the commit, in that order; a rollback drops them all."""
    path = tmp_path / "journal.db"
    book = TaskBook()
    journal = Journal.open(path, create=True)
    try:
        joined, _ = split_commands(book.handle(WorkerJoined("w", "n", Resources(2, 0), 2), 0.0))
        small, _ = split_commands(book.handle(SubmitJob("small", [TaskSpec("s-0", "k", 0)]), 0.0))
        big, _ = split_commands(book.handle(SubmitJob("big", varied(BULK_TASKS, "b")), 0.0))
        leased = book.handle(RequestTask("w", 2), 1.0)
        leases = {c.task_id: c.lease_id for c in leased if isinstance(c, Lease)}
        lease_records = [c for c in leased if isinstance(c, Record)]
        batch = [*joined, *small, *big, *lease_records]
        conn = journal._connection()

        def count(job: str) -> int:  # the journal's own connection sees its open transaction
            return int(conn.execute("SELECT count(*) FROM tasks WHERE job_id = ?", (job,)).fetchone()[0])

        assert journal.stage(batch)
        assert (count("small"), count("big")) == (1, 0)
        journal.rollback()
        assert (count("small"), count("big")) == (0, 0)
        assert journal.stage(batch)
        journal.commit()
        assert (count("small"), count("big")) == (1, BULK_TASKS)
    finally:
        journal.close()
    reader = sqlite3.connect(path)
    journaled = dict(
        reader.execute("SELECT task_id, last_lease_id FROM tasks WHERE state = 'leased'").fetchall()
    )
    reader.close()
    assert journaled == leases and set(leases) == {"s-0", "b-é000000"}  # one of the big job's
    with Journal.open(path) as reopened:
        counts = reopened.replay().statistics().tasks  # the two leased are held over the restart
        assert (counts[TaskState.PENDING], counts[TaskState.LEASED]) == (BULK_TASKS - 1, 2)


def test_a_big_job_that_cannot_be_written_keeps_nothing_of_its_batch(tmp_path: Path) -> None:
    """A bulk insert that fails (a task id the journal holds already: a journal another master
    wrote) fails the commit with JournalError; the batch's earlier records go with it."""
    path = tmp_path / "journal.db"
    with Journal.open(path, create=True) as journal:
        first, _ = split_commands(TaskBook().handle(SubmitJob("first", varied(1, "b")), 0.0))
        journal.append(first)
        other = TaskBook()  # knows nothing of "first": its big job reuses that task id
        small, _ = split_commands(other.handle(SubmitJob("small", [TaskSpec("s-0", "k", 0)]), 0.0))
        big, _ = split_commands(other.handle(SubmitJob("big", varied(BULK_TASKS, "b")), 0.0))
        assert journal.stage([*small, *big])
        with pytest.raises(JournalError, match="appending failed: UNIQUE constraint failed"):
            journal.commit()
        assert [j.job_id for j in journal.replay().jobs()] == ["first"]
        journal.append(small)  # the journal is usable again
        assert [j.job_id for j in journal.replay().jobs()] == ["first", "small"]


def test_a_run_that_names_a_task_twice_is_refused_not_shortened(tmp_path: Path) -> None:
    """A run's chunk is keyed by task id: a repeated id (which the book refuses before any
    journal sees it) fails the insert instead of losing a row."""
    refs: dict[str, str] = {}  # one mapping for all, as a count job's tasks share
    tasks = [TaskSpec(f"t{i % 100}", "k", i, refs) for i in range(200)]
    with (
        Journal.open(tmp_path / "journal.db", create=True) as journal,
        pytest.raises(ValueError, match="names a task id twice"),
    ):
        insert_tasks(journal._connection(), "j", tasks)
