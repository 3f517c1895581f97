"""A job the journal's disk cannot hold is refused at its submit, the master and its other jobs
going on (a journal write that failed for want of space had stopped the master, every running
job with it). The disk is a fake: ``shutil.disk_usage`` answers how much is free."""

from __future__ import annotations

import re
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from support.memory_master import master_in_memory
from troupe.runtime.errors import TaskError
from troupe.runtime.tasks.master import journal_room
from troupe.runtime.tasks.master.journal_room import journal_bytes
from troupe.runtime.tasks.state import TaskSpec

Usage = namedtuple("Usage", "total used free")
REAL_DISK_USAGE = shutil.disk_usage


def test_the_estimate_grows_with_the_tasks_and_their_strings() -> None:
    small = [TaskSpec(f"j-{i:06d}", "k", i) for i in range(100)]
    longer = [
        TaskSpec(f"a-much-longer-job-name-{i:06d}", "k", i, refs={"p": "cas://sha256/" + "0" * 64})
        for i in range(100)
    ]
    assert 0 < journal_bytes(small[:10]) < journal_bytes(small) < journal_bytes(longer)


async def test_a_job_the_disk_cannot_hold_is_refused_and_the_master_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with master_in_memory(tmp_path) as m:
        await m.submit("small", 10)
        need = journal_bytes([TaskSpec(f"big-{i:06d}", "k", i) for i in range(5000)])
        monkeypatch.setattr(journal_room.shutil, "disk_usage", lambda _: Usage(need * 4, need * 3, need))
        with pytest.raises(TaskError, match=r"job 'big' is not submitted: its 5000 tasks need about"):
            await m.submit("big", 5000)
        jobs = {j["job_id"]: j for j in await m.call("jobs")}
        assert set(jobs) == {"small"} and jobs["small"]["state"] == "running"
        await m.submit("small", 10)  # the same job again needs no room: already there
        monkeypatch.setattr(journal_room.shutil, "disk_usage", REAL_DISK_USAGE)
        await m.submit("big", 5000)  # room made: it goes in
        assert {j["job_id"] for j in await m.call("jobs")} == {"small", "big"}


def test_the_refusal_names_the_room_kept_and_gives_advice_that_can_be_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "need about 0.0 MiB ... whose disk has 0.9 MiB free ... or submit fewer tasks":
    the numbers said the job fitted, and a 1-task job cannot be made smaller."""
    journal = tmp_path / "journal.db"
    free = int(0.9 * 2**20)
    monkeypatch.setattr(journal_room.shutil, "disk_usage", lambda _: Usage(free * 2, free, free))
    with pytest.raises(TaskError) as refused:
        journal_room.check_room(journal, "one", [TaskSpec("one-000000", "sleep", 0)])
    assert str(refused.value) == (
        f"job 'one' is not submitted: its 1 task needs about 1 KiB in the journal {journal}, and "
        "2.26 MiB is kept free there besides (the journal's write-ahead log and other writes), but "
        "its disk has 922 KiB free; free space there (`troupe master compact` folds finished jobs' "
        "rows): no job fits until then"
    )

    tasks = [TaskSpec(f"big-{i:06d}", "sleep", i) for i in range(5000)]
    half = journal_room.KEPT_BYTES + journal_bytes(tasks) // 2  # room for half of them
    monkeypatch.setattr(journal_room.shutil, "disk_usage", lambda _: Usage(half * 2, half, half))
    with pytest.raises(TaskError, match=r"or submit at most about (\d+) tasks$") as refused:
        journal_room.check_room(journal, "big", tasks)
    fewer = int(re.search(r"at most about (\d+) tasks$", str(refused.value))[1])  # type: ignore[index]
    assert fewer == 2500  # the rows are of one size here
    journal_room.check_room(journal, "big", tasks[:fewer])  # what it says fits does fit
