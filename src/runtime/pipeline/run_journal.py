"""A one-host run's own journal (``out/.troupe/journal.db``): opened, or set aside when damaged.

The journal says which items a run leased, committed, pruned or gave up on; the outputs the
stages committed in ``out`` say what was made, and they are the truth (a run that finds no
journal starts from them: its stages' ``start`` lists what they hold). A journal whose file is
not a healthy SQLite database (cut short, bytes changed: ``JournalDamaged``) held nothing that
cannot be found again, so the run moves it aside, with its WAL files, as ``journal.db.damaged``
and goes on from the outputs, saying so. What is lost: the items that died or were pruned run
again, and attempts count from 1. It used to refuse, and its advice, ``--fresh``, made every
committed item again. Any other journal error (held by another process, a newer schema) still
refuses: nothing is wrong with the file. A journal of an older troupe's schema is upgraded as it
opens (``journal_backup`` keeps it as it was beside it): said in a line too, naming the copy; so
is a journal not closed cleanly found without its ``-wal`` (moved or copied without it).

The items the journal has leased were leased to the run that wrote it, which is gone: they go
back to pending as the journal opens (``TaskBook.release_held_over``), where a cluster's master
holds a lease over a restart for its holder to renew.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from troupe.runtime.errors import JournalDamaged
from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.journal_lock import JournalLock
from troupe.runtime.tasks.master.journal_open import open_journal

__all__ = ["DAMAGED_SUFFIX", "open_run_journal"]

log = get_logger(__name__)

DAMAGED_SUFFIX = ".damaged"
_SQLITE_SIDES = ("", "-wal", "-shm")  # the database and what SQLite keeps beside it


def open_run_journal(
    path: Path, on_event: Callable[[str], None] | None = None, lock: JournalLock | None = None
) -> tuple[Journal, TaskBook]:
    """The run's journal at ``path`` and its replayed book; a damaged one is set aside first
    (``on_event`` is told, in a line for people). ``lock``: the journal's lock, held since the
    run checked its folder (``RunDir.prepare``), taken over by the journal (see
    :func:`open_journal`), so that no other run takes the folder in between, nor while a damaged
    journal is set aside.

    Raises:
        JournalError: as :func:`open_journal`, but for a damaged file.
    """
    try:
        return _held_by_none(_said_opened(open_journal(path, new=True, lock=lock), on_event))
    except JournalDamaged as exc:
        damage = exc.reason
    aside = path.with_name(path.name + DAMAGED_SUFFIX)
    for side in _SQLITE_SIDES:
        if os.path.lexists(f"{path}{side}"):
            os.replace(f"{path}{side}", f"{aside}{side}")
        elif os.path.lexists(f"{aside}{side}"):  # an earlier damaged journal's: not this one's
            os.unlink(f"{aside}{side}")
    log.warning("run_journal_damaged", path=str(path), moved_to=str(aside), error=damage)
    if on_event is not None:
        on_event(
            f"the run's journal {path} was damaged ({damage}): it is kept as {aside.name} beside it, "
            "and the run goes on from the outputs committed in its folder (items that died or were "
            "pruned run again)"
        )
    return open_journal(path, new=True, lock=lock)


def _held_by_none(opened: tuple[Journal, TaskBook]) -> tuple[Journal, TaskBook]:
    """``opened``, the leases of the run that wrote it back to pending: it is gone."""
    released = opened[1].release_held_over()
    if released:
        log.info("run_journal_leases_released", items=released)
    return opened


def _said_opened(
    opened: tuple[Journal, TaskBook], on_event: Callable[[str], None] | None
) -> tuple[Journal, TaskBook]:
    """``opened``, what its open found said through ``on_event``, as ``troupe master start``
    says it of a master's (``troupe.cli.journal_notes``): its upgrade from an older troupe's
    schema (the copy kept of it stays in the run's folder until --fresh), and that it was not
    closed cleanly and has no ``-wal`` beside it (``journal_opened.py``); each was said only in
    the run's log."""
    journal = opened[0]
    if on_event is None:
        return opened
    if journal.upgraded is not None:
        on_event(
            journal.upgraded.said(
                "the run's journal", journal.path, "that troupe resumes from it; it stays until --fresh"
            )
        )
    if journal.left_open is not None:
        on_event(f"the run's {journal.left_open.said(journal.path, 'this run')}")
    return opened
