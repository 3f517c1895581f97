"""``troupe master compact`` gives the disk back: the journal's file shrunk to what it holds.

Compaction deletes task rows, and SQLite keeps the pages they took as free pages of the file,
reused by later writes: after a job of a million tasks was compacted the file stayed at its
peak size, 98 % of it free pages, and the operator who compacted to reclaim space got nothing
back. :func:`shrink` rewrites the file without them (``Journal.vacuum``), for a journal no
master holds (``master compact`` holds its lock).

A rewrite needs room for a copy of what the journal holds, twice: SQLite builds the copy in its
temporary folder, then writes every page of it to the journal's write-ahead log before the file
is cut. Where a disk has less free than that (and a spare), the file is left as it is and the
reason said: the compaction is done, and a disk too full to shrink a file is no reason to fail
it. A rewrite that fails anyway (the disk filled meanwhile) changes nothing, and is said too.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from troupe.runtime.errors import JournalError
from troupe.runtime.tasks.journal import Journal

from .journal_room import size_text

__all__ = ["files_bytes", "shrink", "sqlite_temp_folder"]

_FRAME_BYTES = 24  # each page in the write-ahead log has a header of its own
_SPARE = 1 << 20  # left free on each disk while the copy is written: others write there too


def shrink(journal: Journal) -> str | None:
    """Rewrite ``journal`` without its free pages, where its disks have room for that.

    Returns:
        Why the file was not shrunk, in one line; None where it was (or had no free pages).
    """
    count, free, page = journal.pages()
    if free == 0:
        return None
    held = (count - free) * page  # what the copy holds: the pages in use
    short = _short_of_room(journal.path, held, (count - free) * (page + _FRAME_BYTES))
    if short is not None:
        return short
    try:
        journal.vacuum()
    except JournalError as exc:
        return f"the rewrite failed and changed nothing: {exc}"
    return None


def files_bytes(path: Path) -> int:
    """Bytes of the journal's file and of its write-ahead log."""
    total = 0
    for file in (path, Path(f"{path}-wal")):
        try:
            total += file.stat().st_size
        except OSError:
            pass
    return total


def sqlite_temp_folder() -> Path:
    """The folder SQLite writes its temporary files to on Unix (``unixTempFileDir``): the first
    writable folder of ``$SQLITE_TMPDIR``, ``$TMPDIR``, /var/tmp, /usr/tmp, /tmp, else the current one."""
    for name in (os.environ.get("SQLITE_TMPDIR"), os.environ.get("TMPDIR"), "/var/tmp", "/usr/tmp", "/tmp"):
        if name and os.path.isdir(name) and os.access(name, os.W_OK | os.X_OK):
            return Path(name)
    return Path(".")


def _short_of_room(journal: Path, copy_bytes: int, log_bytes: int) -> str | None:
    """Why the disks cannot hold the rewrite's copy (in the temporary folder) and its log (beside
    the journal), or None where they can; a disk that cannot be asked is taken to have room."""
    temp = sqlite_temp_folder()
    needs: dict[int, tuple[Path, int]] = {}
    for folder, need in ((journal.parent, log_bytes), (temp, copy_bytes)):
        try:
            device = os.stat(folder).st_dev
        except OSError:
            continue
        where, before = needs.get(device, (folder, 0))
        needs[device] = (where, before + need)
    for where, need in needs.values():
        try:
            free = shutil.disk_usage(where).free
        except OSError:
            continue
        if free < need + _SPARE:
            return (
                f"a rewrite needs about {size_text(need + _SPARE)} free on the disk of {where} "
                f"(a copy of the journal's {size_text(copy_bytes)} in use, in SQLite's temporary folder "
                f"{temp}, and in the journal's log), and it has {size_text(free)}; free space there "
                "and run `troupe master compact` again to shrink it"
            )
    return None
