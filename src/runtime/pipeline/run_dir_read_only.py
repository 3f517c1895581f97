"""A run folder this process cannot write (a read-only mount, an archive): what a rerun may still
read there.

A finished dataset archived read-only could not be asked whether it was complete: the rerun's
checks probed a write first, and holding the folder takes its lock file, opened for writing, so
``troupe run --out ro`` said ``cannot write in .../ro`` (exit 2), and a script that reads
``already_complete`` could not tell a complete dataset from a broken one (report up 7). The
rerun of a finished run writes nothing, so ``RunDir.answer_read_only`` answers it from the
record, taking no lock: no run can hold a folder it cannot write (a read-only mount refuses the
lock file's opening for writing; a run holding it as another user is seen by a shared flock,
:func:`held_read_only`).

Its outputs must be as the record says. A folder finished elsewhere and mounted or copied here
since (a bind mount of the original, ``cp -a``) names them where it was: they are looked for at
the same places under this folder, each of its recorded size and modification time, and the
answer names this folder (:func:`found_here`). A writable folder moved since is finalised again
instead, where it is (``RunDir.still_there``); this one cannot be.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from pathlib import Path
from typing import Any

from troupe.runtime.tasks.journal_lock import lock_path

__all__ = ["cannot_write", "found_here", "held_read_only"]


def cannot_write(folder: Path) -> bool:
    """Whether this process may not write in ``folder`` (nor in its nearest existing parent):
    its file system is mounted read-only, or its permissions refuse this user."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return not os.access(existing, os.W_OK)


def held_read_only(target: Path) -> bool:
    """Whether a process holds the lock of ``target`` (``JournalLock``), probed without writing:
    a shared flock on its lock file, opened read-only, is refused while a holder has its own."""
    try:
        fd = os.open(lock_path(target), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # none there: none was ever taken
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)  # the shared flock with it
    return False


def found_here(complete: dict[str, Any], outputs: list[str], out: Path) -> dict[str, Any] | None:
    """``complete`` (a record's, whose finalize hooks wrote ``outputs``) as it reads in the folder
    ``out`` it was finished in, or was mounted or copied to since, where every output is there
    with its recorded size and modification time; None where one is not (or the record has no
    size of it).

    Finished elsewhere, its paths (the outputs, and the finals' lines) name ``out`` instead."""
    made_in = complete.get("out")
    recorded = complete.get("stats")
    if not isinstance(made_in, str) or not isinstance(recorded, dict):
        return None
    for path in outputs:
        if not Path(path).is_relative_to(made_in):
            return None  # written outside its folder: not moved with it
        here = out / Path(path).relative_to(made_in)
        try:
            st = os.stat(here)
        except OSError:
            return None
        if recorded.get(path) != [st.st_size, st.st_mtime_ns]:
            return None
    if made_in == str(out):
        return complete
    found: dict[str, Any] = _renamed(complete, made_in, str(out))
    return found


def _renamed(value: Any, old: str, new: str) -> Any:
    """``value`` with the folder ``old`` named ``new`` in every text (a dict's keys too): a path
    under it, or a line naming it (``... LeRobot v3.0 at /data/o1``)."""
    if isinstance(value, str):
        # ``old`` itself, or followed by a path's next part; not ``/data/o1`` in ``/data/o10``.
        return re.sub(re.escape(old) + r"(?=/|$|[\s'\"),;:])", lambda _: new, value)
    if isinstance(value, dict):
        return {_renamed(k, old, new): _renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, old, new) for v in value]
    return value
