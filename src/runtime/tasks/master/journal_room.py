"""Whether the journal's disk has room for a job, asked before the job is submitted.

A journal write that fails for want of space stops the master (what it holds in memory would
no longer be what its journal holds), and every running job stops with it; a restart on the
same full disk goes on, the job that did not fit rolled back. A job too large for the disk is
refused at its submit instead, the master and the other jobs left running: its rows are
estimated from what a submit writes (a task's row and its id's index, in the write-ahead log
and again in the database once checkpointed: about 190 bytes for ``job-000000`` of kind
``sleep``, measured). An estimate, not a promise: a disk that fills from elsewhere still stops
the master, as before.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from troupe.runtime.errors import TaskError
from troupe.runtime.tasks.state import TaskSpec

__all__ = ["ROW_OVERHEAD", "check_room", "journal_bytes"]

ROW_OVERHEAD = 80  # a task row's own bytes beyond its strings: numbers, row and page headers
_COPIES = 2  # the write-ahead log, then the database file once checkpointed
_SPARE = 1 << 20  # left free besides: the journal's other writes (leases, reports) need room too
_MIB = 1 << 20


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
        TaskError: the disk holding ``journal`` has less free space than the job needs.
    """
    try:
        free = shutil.disk_usage(journal.parent).free
    except OSError:  # no file system to ask (an in-memory journal): the write says
        return
    need = journal_bytes(tasks)
    if need + _SPARE > free:
        raise TaskError(
            f"job {job_id!r} is not submitted: its {len(tasks)} tasks need about {need / _MIB:.1f} "
            f"MiB in the journal {journal}, whose disk has {free / _MIB:.1f} MiB free; free space "
            "there (`troupe master compact` folds finished jobs' rows), or submit fewer tasks"
        )
