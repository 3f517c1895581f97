"""A compacted job's task ids stay taken (report jx 5): a new job reusing one was accepted once
the first job was compacted, and its task was "done" at once with the first job's output (the
output store is keyed by task id), its own work never run. Refused now as before compaction, by
a running master's book (fold) and by a book replayed from the compacted journal alike."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from support.journal_drive import drive, leases
from support.memory_master import master_in_memory
from support.older_journal import as_older
from troupe.runtime.errors import TaskError
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.compacted_ids import generated_owner
from troupe.runtime.tasks.job_digest import job_digest
from troupe.runtime.tasks.journal import SCHEMA_VERSION, Journal
from troupe.runtime.tasks.master.journal_open import COMPACT_AFTER_S
from troupe.runtime.tasks.state import (
    Command,
    Complete,
    Event,
    JobPolicy,
    Reject,
    RequestTask,
    Resources,
    SubmitJob,
    TaskSpec,
    WorkerJoined,
)
from troupe.runtime.tasks.task_actor import LeasedTask

# Job "a"'s explicit ids: some shaped as its own generated ids ("a-<6+ digits>": its job id
# accounts for them), the others kept one by one; "g" generates its ids.
A_IDS = ["scene-17", "a-000001", "a-0000002", "a-1", "a-00000x", "b-000001", "g-000009", "a-"]
G_IDS = [f"g-{i:06d}" for i in range(3)]
FREE = ["scene-18", "a-00001", "b-000002", "g", "a", "c-000001", "h-000000"]
USED = "is used twice; ids must be unique across jobs"


class Wall:
    """The master's wall clock, moved on by the test (what was journaled keeps its real time)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


def _done_jobs(book: TaskBook, journal: Journal | None) -> None:
    """Jobs "a" and "g" submitted and done (their records journaled where a journal is given)."""

    def step(event: Event, now: float) -> list[Command]:
        return list(book.handle(event, now)) if journal is None else drive(book, journal, event, now)

    step(SubmitJob("a", [TaskSpec(t, "k", i) for i, t in enumerate(A_IDS)], JobPolicy()), 0.0)
    step(SubmitJob("g", [TaskSpec(t, "k", i) for i, t in enumerate(G_IDS)], JobPolicy()), 0.0)
    step(WorkerJoined("w", "n", Resources(16, 0), 16), 0.0)
    for lease in leases(step(RequestTask("w", 16), 1.0)):
        step(Complete("w", lease.task_id, lease.lease_id, f"out/{lease.task_id}"), 2.0)
    assert [j.state.value for j in book.jobs()] == ["done", "done"]


def _folded_book(forget_slice: int) -> TaskBook:
    """A book whose jobs "a" and "g" are done and folded as a running master's compaction does."""
    book = TaskBook()
    _done_jobs(book, None)
    for job_id, ids in (("a", A_IDS), ("g", G_IDS)):
        book.fold(job_id, job_digest(TaskSpec(t, "k", i) for i, t in enumerate(ids)))
        while book.forget_folded(forget_slice):
            pass
    return book


def _refusal(book: TaskBook, task_id: str) -> str | None:
    """Why a new job of the one task ``task_id`` is refused; None: it is accepted (and taken)."""
    job_id = f"new-{task_id}"
    (answer, *_) = book.handle(SubmitJob(job_id, [TaskSpec(task_id, "k", 99)], JobPolicy()), 3.0)
    return answer.reason if isinstance(answer, Reject) else None


def _refused(book: TaskBook) -> dict[str, str | None]:
    """Why a new job of each of the compacted jobs' task ids is refused (None: accepted)."""
    return {task_id: _refusal(book, task_id) for task_id in A_IDS + G_IDS}


def test_a_running_masters_fold_keeps_the_ids_taken() -> None:
    book = TaskBook()
    _done_jobs(book, None)
    before = {task_id: _refusal(book, task_id) for task_id in ["scene-17", "g-000001"]}
    assert all(reason is not None and USED in reason for reason in before.values())
    book = _folded_book(forget_slice=2)
    with pytest.raises(TaskError, match="unknown task 'scene-17'"):
        book.task("scene-17")  # its row is gone; its id is not
    for task_id, reason in _refused(book).items():
        owner = "g" if task_id in G_IDS else "a"  # "g-000009" was a's, an explicit id
        assert reason == f"task id {task_id!r} {USED} (job {owner!r}, compacted, keeps its tasks' ids)"
    assert all(_refusal(book, task_id) is None for task_id in FREE)


def test_a_compacted_journal_keeps_them_taken_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with Journal.open(path, create=True) as journal:
        _done_jobs(TaskBook(), journal)
        assert journal.compact(time.time()).jobs == 2
    with Journal.open(path) as journal:
        book = journal.replay()
    refused = _refused(book)
    assert refused == _refused(_folded_book(forget_slice=100))  # the SQL keeps what the book keeps
    assert all(reason is not None and USED in reason for reason in refused.values())
    assert all(_refusal(book, task_id) is None for task_id in FREE)


@pytest.mark.parametrize(
    ("task_id", "owner"),
    [
        ("a-000001", "a"),
        ("a-b-1234567", "a-b"),
        ("a-00000x", None),
        ("a-00001", None),
        ("a", None),
        ("-000001", ""),
    ],
)
def test_the_generated_shape(task_id: str, owner: str | None) -> None:
    assert generated_owner(task_id) == owner


def _job(name: str, tasks: list[dict[str, object]] | None = None, **job: object) -> dict[str, object]:
    spec: dict[str, object] = {"job": {"name": name, "kind": "k", **job}}
    if tasks is not None:
        spec["tasks"] = tasks
    return {"job": spec, "source": "t"}


async def test_a_master_refuses_them_after_its_compaction_and_its_restart(tmp_path: Path) -> None:
    """The finding's case through a master: job "B" reuses job "A"'s explicit id "scene-17";
    generated ids stay safe as a compacted job's id stays taken."""
    wall = Wall()
    a_job = _job("A", tasks=[{"id": "scene-17", "seed": 17}])
    b_job = _job("B", tasks=[{"id": "scene-17", "seed": 99}])

    async def write(task: LeasedTask) -> str:
        await anyio.lowlevel.checkpoint()
        return f"out/{task.task_id}"

    async with master_in_memory(tmp_path, wall) as m, m.worker("w", write):
        await m.call("submit", a_job)
        await m.call("submit", _job("g", count=2))
        for job_id in ("A", "g"):
            assert (await m.call("wait_job", {"job_id": job_id, "timeout_s": 10.0}, timeout=15.0))[
                "state"
            ] == "done"
        wall.ahead = COMPACT_AFTER_S + 1.0
        assert (await m.master.compact()).jobs == 2
        with pytest.raises(TaskError, match=f"task id 'scene-17' {USED} \\(job 'A', compacted"):
            await m.call("submit", b_job)
    async with master_in_memory(tmp_path) as m:
        with pytest.raises(TaskError, match=f"task id 'scene-17' {USED} \\(job 'A', compacted"):
            await m.call("submit", b_job)
        with pytest.raises(TaskError, match=f"task id 'g-000001' {USED} \\(job 'g', compacted"):
            await m.call("submit", _job("x", tasks=[{"id": "g-000001", "seed": 1}]))
        with pytest.raises(TaskError, match="job id 'g' is taken"):
            await m.call("submit", _job("g", count=3))  # its generated ids cannot come again
        assert (await m.call("submit", _job("h", count=2)))["tasks"] == 2
        assert [j["job_id"] for j in await m.call("jobs")] == ["A", "g", "h"]


def test_a_version_3_journal_gains_the_table_and_keeps_ids_from_then_on(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    Journal.open(path, create=True).close()
    as_older(path, 3, "DROP TABLE compacted_task_ids")  # what a version-3 journal holds
    with Journal.open(path) as journal:
        _done_jobs(TaskBook(), journal)
        assert journal.compact(time.time()).jobs == 2
    with Journal.open(path) as journal:
        assert (
            _refusal(journal.replay(), "scene-17")
            == f"task id 'scene-17' {USED} (job 'a', compacted, keeps its tasks' ids)"
        )
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
