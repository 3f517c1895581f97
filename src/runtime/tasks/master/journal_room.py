"""Whether the journal's disk has room for a job, asked before the job is submitted, and
room for a master at all, asked as it opens its journal.

A journal write that fails for want of space stops the master (what it holds in memory would
no longer be what its journal holds), and every running job stops with it; a restart on the
same full disk goes on, the job that did not fit rolled back. A job too large for the disk is
refused at its submit instead, the master and the other jobs left running. What a job needs:
its rows, estimated from what a submit writes (a task's row and its id's index, in the
write-ahead log and again in the database once checkpointed: about 190 bytes for
``job-000000`` of kind ``sleep``, measured). What every master needs besides, whatever its
jobs (:data:`KEPT_BYTES`): room for the write-ahead log to reach its bound (``journal_wal.py``:
about 1.3 MiB, of which the log's file already holds what it holds) and a spare for the other
writes (leases, completions, errors). A master whose journal's disk has not that much free is
refused as it opens the journal, in one line, rather than started to stop at its first writes.
An estimate, not a promise: a disk that fills from elsewhere still stops the master, as before.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from troupe.runtime.errors import JournalError, TaskError
from troupe.runtime.tasks import journal_wal
from troupe.runtime.tasks.state import TaskSpec

__all__ = ["KEPT_BYTES", "ROW_OVERHEAD", "check_room", "check_start_room", "journal_bytes", "size_text"]

ROW_OVERHEAD = 80  # a task row's own bytes beyond its strings: numbers, row and page headers
_COPIES = 2  # the write-ahead log, then the database file once checkpointed
_SPARE = 1 << 20  # the journal's other writes (leases, completions, errors) need room too
KEPT_BYTES = journal_wal.MAX_BYTES + _SPARE
"""Free space kept on the journal's disk whatever the jobs: the log's bound and the spare."""


def journal_bytes(tasks: Sequence[TaskSpec]) -> int:
    """About what submitting ``tasks`` writes to the journal's disk, at most."""
    each = sum(
        2 * len(t.task_id) + len(t.kind) + sum(len(k) + len(v) for k, v in t.refs.items()) + ROW_OVERHEAD
        for t in tasks
    )
    return _COPIES * each


def check_room(journal: Path, job_id: str, tasks: Sequence[TaskSpec]) -> None:
    """Refuse a job its journal's disk cannot hold.

    Raises:
        TaskError: the disk holding ``journal`` has less free space than the job needs and
            :data:`KEPT_BYTES` besides.
    """
    room = _room(journal)
    if room is None:
        return
    free, usable = room
    need = journal_bytes(tasks)
    if need <= usable:
        return
    count = len(tasks)
    fewer = count * usable // need if usable > 0 else 0  # the rows are about the same size each
    advice = f", or submit at most about {fewer} tasks" if fewer > 0 else ": no job fits until then"
    raise TaskError(
        f"job {job_id!r} is not submitted: its {count} task{'s' if count != 1 else ''} need"
        f"{'' if count != 1 else 's'} about {size_text(need)} in the journal {journal}, and "
        f"{size_text(KEPT_BYTES)} is kept free there besides (the journal's write-ahead log and other "
        f"writes), but its disk has {size_text(free)} free; free space there (`troupe master compact` "
        f"folds finished jobs' rows){advice}"
    )


def check_start_room(journal: Path) -> None:
    """Refuse to open ``journal`` for a master where its disk has not :data:`KEPT_BYTES` free.

    Raises:
        JournalError: the disk holding ``journal`` has too little free space.
    """
    room = _room(journal)
    if room is not None and room[1] < 0:
        raise JournalError(
            f"journal {journal}: its disk has {size_text(room[0])} free, and a master needs about "
            f"{size_text(KEPT_BYTES)} there (the journal's write-ahead log and its writes); free space "
            f"on it (df {journal.parent}), then start again: what was recorded stays"
        )


def _room(journal: Path) -> tuple[int, int] | None:
    """The free bytes on the journal's disk, and what of them is left for new rows once
    :data:`KEPT_BYTES` is kept (negative: less than that); None where no disk answers."""
    try:
        free = shutil.disk_usage(journal.parent).free
    except OSError:  # no file system to ask (an in-memory journal): the write says
        return None
    try:  # the log's file holds its room already, up to its bound
        held = min(os.stat(f"{journal}-wal").st_size, journal_wal.MAX_BYTES)
    except OSError:
        held = 0
    return free, free + held - KEPT_BYTES


def size_text(n: int) -> str:
    """``n`` bytes for people: KiB below a MiB, so a small need is not "0.0 MiB", and MiB to two
    places, so a disk a little short of the room kept does not read as having just that."""
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{max(1, round(n / 1024)) if n > 0 else 0} KiB"
