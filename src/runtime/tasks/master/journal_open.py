"""Opening the master's journal: its lock taken, old finished jobs compacted, the task book
replayed."""

from __future__ import annotations

import os
import time
from pathlib import Path

from troupe.runtime.errors import JournalError
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.journal_lock import JournalLock
from troupe.runtime.tasks.journal_opened import refuse_orphaned_wal

from .journal_room import check_start_room

__all__ = ["COMPACT_AFTER_S", "check_folder", "open_journal"]

COMPACT_AFTER_S = 3600.0
"""A master compacts the jobs that finished at least this long ago: as it starts on its journal,
and every ``COMPACT_EVERY_S`` while it runs (``compaction.py``)."""


def open_journal(
    path: str | os.PathLike[str],
    new: bool = False,
    compact_after_s: float | None = COMPACT_AFTER_S,
    lock: JournalLock | None = None,
) -> tuple[Journal, TaskBook]:
    """Open the master's journal (taking its lock), compact old finished jobs, replay it.

    A missing journal is an error unless ``new`` (``--new``) is given: a master that silently
    started on an empty queue would lose every job of the journal it was meant to resume.
    With ``new``, a missing file is created; an existing journal is still opened as it is. A
    missing journal whose ``-wal`` is there is refused either way (``journal_opened.py``).
    Jobs finished ``compact_after_s`` ago or more are compacted first (see
    :meth:`Journal.compact`), so a restart replays their counts, not their tasks; None skips it.
    A journal whose disk has less free space than a master needs is refused before it is
    opened or created (``journal_room.check_start_room``).
    ``lock``: the journal's lock, held already, taken over (see :meth:`Journal.open`): it stays
    the caller's, held, where this raises.

    Raises:
        JournalBusy: another master holds the journal.
        JournalError: missing (without ``new``), its folder missing or its ``-wal`` there
            without it (with ``new`` too), not a
            troupe journal, corrupt, a row of the wrong type (named), or its disk too full for
            a master.
    """
    if not os.path.exists(path):
        check_folder(Path(path), new)
        refuse_orphaned_wal(Path(path))  # with --new too: a new journal there would delete it
        if not new:
            raise JournalError(
                f"journal {path} does not exist; give the path of the existing journal, or pass "
                "--new to start a new, empty journal there"
            )
    check_start_room(Path(path))  # said now, in one line, not as the first write fails
    journal = Journal.open(path, create=new, new_hint="pass --new to start a new journal there", lock=lock)
    try:
        if compact_after_s is not None:
            journal.compact(time.time() - compact_after_s)
        return journal, journal.replay()
    except BaseException:
        journal.close(release=lock is None)
        raise


def check_folder(path: Path, new: bool) -> None:
    """Refuse a journal whose folder is missing, saying that first, before any ``--new`` advice.

    A journal missing with its folder is the systemd unit's "disk not mounted at boot": ``--new``
    there fails too (no folder to create it in), and once the folder is there it would start the
    master over on an empty queue. ``new``: the caller asked for a new journal (``--new``, ``master
    init``), so the way out is to create the folder; else, to mount the disk or fix the path.

    Raises:
        JournalError: the folder of ``path`` does not exist, or is not a folder.
    """
    folder = path.parent
    if folder.is_dir():
        return
    if folder.exists():
        raise JournalError(f"journal {path}: {folder} is a file, not a folder; give the journal's right path")
    way_out = "create the folder first" if new else "mount it, or give the path of the existing journal"
    raise JournalError(
        f"journal {path}: its folder {folder} does not exist: a disk not mounted? nothing was "
        f"created; {way_out}"
    )
