"""The ``note:`` lines said on stderr when a command opens a master's journal: an upgrade from
an older troupe's schema (where the copy kept of it lies), and a journal not closed cleanly found
without its ``-wal`` (``journal_opened.py``). Both were said only in the log, which ``master
compact`` shows only at warning level and which a ``master start`` operator may not read;
``master start``, a node ``--with-master`` and ``master compact`` say them here alike. A
``troupe run`` says its own journal's through ``on_event`` (``pipeline/run_journal.py``)."""

from __future__ import annotations

from troupe.runtime.tasks.journal import Journal

from .client import err_console
from .literal import literal

__all__ = ["say_journal_notes"]


def say_journal_notes(journal: Journal, goes_on: str) -> None:
    """Say what ``journal``'s open found that its opener should know; ``goes_on`` names the
    opener in the sentence (``this master``, ``this compaction``)."""
    upgraded = journal.upgraded
    if upgraded is not None:  # the copy stays until removed: said where it is, not only in the log
        said = upgraded.said("journal", journal.path, "that troupe's master resumes from it")
        _note(said)
    left_open = journal.left_open
    if left_open is not None:  # its -wal may lie where it was: said before the journal is used
        _note(left_open.said(journal.path, goes_on))


def _note(line: str) -> None:
    err_console.print(literal(f"note: {line}"), highlight=False, soft_wrap=True)
