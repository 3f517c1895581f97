"""One standalone node per name and log folder, with no race between two started at once: an
exclusive ``fcntl.flock`` on ``<log_dir>/<node>.name.lock``, taken before the namesake check
and held for the node's life.

The ``<node>.<pid>.pids`` record (``leftovers.py``) says that a name is in use only once it is
written, as the node serves: two nodes started in the same instant both found none, both ran,
wrote one ``<node>.jsonl`` and reaped each other's children as a dead predecessor's. The kernel
grants or refuses a flock in one step, so of two nodes at once exactly one holds it, and it drops
the lock when its holder dies, however it dies (SIGKILL too): nothing stale is left to clean
away, and the file is never deleted (deleted, a third node would lock a fresh file while the
first still held the old one). A refused node names the holder's pid from the kernel's table of
locks (``flock_holder``), which has it from the instant the lock is held; the pid the holder
writes into the file stands in where there is no such table.

A master (``troupe master start``) holds its ``--name`` in its ``--logs`` with the same lock,
for the same reason: two masters of one name and log folder, on two journals, both wrote one
``<name>.jsonl``. The lock is one per log file, whoever writes it, a node or a master.

``<node>.name.lock`` is no other file's name, of any node: not a record (``<n>.<pid>.pids``), a
log (``<n>.jsonl``, ``<n>.jsonl.N``), a rotation lock (``<n>.jsonl.lock``) nor a count of
rotations (``<n>.rotations``), so neither the predecessors' reaping, ``troupe logs`` nor the log
rotation takes it for one of theirs.

As the records are, a lock file another user made there (a shared log folder) is not used: it is
theirs to hold, and a symbolic link put there is not followed (it could name any file of ours,
which the pid would overwrite). There, and where no lock can be had at all (a folder this user
may not write, a file system without flock), the records alone say whether the name is in use,
as before. The descriptor is close-on-exec: the node's children (its template, spawned, forks its
workers) never hold the lock once the node is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from troupe.runtime.file_owner import is_another_users
from troupe.runtime.flock_holder import flock_holder

__all__ = ["NameHold", "hold_name", "name_lock_file"]


def name_lock_file(log_dir: Path, node: str) -> Path:
    """The file whose flock says that the node ``node`` runs with its log in ``log_dir``."""
    return log_dir / f"{node}.name.lock"


class NameHold:
    """What :func:`hold_name` found: the name held by this process (``holder`` None: held for the
    node's life, or where no lock can be had, not held and left to the records), or by another.

    Args:
        fd: the locked descriptor of the lock file, or None.
        holder: the pid of the process that holds the name (``unknown`` where nothing says it),
            or None.
    """

    def __init__(self, fd: int | None, holder: str | None = None) -> None:
        self._fd = fd
        self.holder = holder

    @property
    def held(self) -> bool:
        """Whether this process holds the name's lock."""
        return self._fd is not None

    def __enter__(self) -> NameHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Let the name go (the node has stopped). Releasing twice is fine."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the only descriptor: the flock goes with it


def hold_name(log_dir: Path, node: str) -> NameHold:
    """Take the name ``node`` in ``log_dir`` without waiting, before anything of the node is
    written there; keep what this returns until the node stops (a ``with`` block lets it go).

    Returns:
        The hold: held by this process; or ``holder``, the pid of the node holding it; or neither,
        where no lock can be had (another user's lock file, a folder this user may not write, a
        file system without flock): the records alone decide there.
    """
    path = name_lock_file(log_dir, node)
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        # 0o666: the umask decides, as for the records and the log beside it.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError:
        return NameHold(None)
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return NameHold(None)
    if not stat.S_ISREG(st.st_mode) or is_another_users(st):
        os.close(fd)
        return NameHold(None)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd, st)
        os.close(fd)
        return NameHold(None, holder)
    except OSError:  # no flock on this file system (ENOLCK)
        os.close(fd)
        return NameHold(None)
    with contextlib.suppress(OSError):  # the pid is for a refusal where /proc/locks is not
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return NameHold(fd)


def _holder(fd: int, st: os.stat_result) -> str:
    """The pid of the process holding the lock of ``fd``: the kernel's word, else the file's."""
    held_by = flock_holder(st)
    if held_by is not None:
        return held_by
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"
