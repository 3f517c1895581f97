"""The master's watch on its journal's file: deleted, replaced or cut short while it runs.

SQLite writes on through the descriptor it opened: a journal deleted under a running master
(``rm journal.db*``) or replaced took every write after, acknowledged as journaled, into a file
no restart would find, and ``truncate -s 0`` cut the database under the write-ahead log; the
master went on for as long as it ran, and its next start said the journal does not exist. The
watch looks at the path every second: another file there (its device and inode), none, or a
database file shorter than it was (the master never shrinks it: compaction deletes rows, not
pages) ends the master with a :class:`~troupe.runtime.errors.JournalError` that says so, and
what to do: a cluster's operator restores the journal or starts a new one and submits the jobs
again (:data:`OPERATOR_ADVICE`); a ``troupe run``'s own master, which has no ``--new`` and no
jobs to submit, says its own (``MasterConfig.journal_lost_advice``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import anyio

from troupe.runtime.errors import JournalError
from troupe.runtime.start_limits import in_thread

__all__ = ["INTERVAL_S", "OPERATOR_ADVICE", "JournalFile", "watch_journal"]

INTERVAL_S = 1.0
OPERATOR_ADVICE = "Restore the journal from a backup, or start a new one (--new), and submit the jobs again"


@dataclass(frozen=True)
class JournalFile:
    """What the journal's path held when the master opened it: its device, inode and size."""

    path: Path
    device: int
    inode: int
    size: int

    @classmethod
    def at(cls, path: Path) -> JournalFile | None:
        """The file at ``path`` now; None where there is none (a journal in memory)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(path, st.st_dev, st.st_ino, st.st_size)

    def lost(self, now: JournalFile | None) -> str | None:
        """What happened to the journal's file since (None: nothing wrong)."""
        if now is None:
            return "was deleted"
        if (now.device, now.inode) != (self.device, self.inode):
            return "was replaced by another file"
        if now.size < self.size:
            return f"was cut short ({now.size} bytes, {self.size} before)"
        return None


async def watch_journal(
    opened: JournalFile, interval_s: float = INTERVAL_S, advice: str = OPERATOR_ADVICE
) -> JournalError:
    """Wait until the journal's file is lost (deleted, replaced, cut short); the error that says
    so, that nothing the master wrote since is kept, and ``advice``: what to do."""
    last = opened
    while True:
        await anyio.sleep(interval_s)
        now = await in_thread(JournalFile.at, opened.path, what="journal_look")
        what = last.lost(now)
        if what is not None:
            return JournalError(
                f"journal {opened.path} {what} while the master ran: what it wrote since is not in "
                f"any journal a restart would read; the master stopped. {advice}"
            )
        assert now is not None
        last = now
