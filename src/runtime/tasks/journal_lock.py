"""One master per journal: an exclusive OS lock on a sidecar file, held while the journal is open.

Two masters serving one journal would both lease its tasks. :class:`JournalLock` takes
``fcntl.flock`` on ``<journal>.lock`` beside the real file, symlinks resolved, so a symlink to the
journal takes the same lock (not on the SQLite file: SQLite takes and drops its own locks on that
file). The kernel releases a flock when its holder dies, however it dies, so a
master killed with SIGKILL never leaves a stale lock behind and a rerun starts at once. The
holder writes its pid into the file, only so that the refusal can name it; the file itself is
never deleted (deleting it would let a third process lock a fresh file while the first still
holds the old one).

The descriptor is close-on-exec, so worker processes a master starts do not inherit the lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from troupe.runtime.errors import JournalError

__all__ = ["JournalBusy", "JournalLock", "lock_path"]


class JournalBusy(JournalError):
    """Another process (a master, ``troupe run``, ``master compact``) holds the journal."""


def lock_path(journal: Path) -> Path:
    """Return the sidecar lock file of a journal: beside the file itself, symlinks resolved, so
    that a symlink to a journal (or to its folder) takes the same lock as the journal."""
    real = Path(os.path.realpath(journal))
    return real.with_name(real.name + ".lock")


class JournalLock:
    """The held lock of one journal. Use :meth:`acquire`; :meth:`release` (or dropping it) frees it.

    Args:
        fd: the open, locked descriptor of the lock file.
        path: the lock file.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, journal: Path) -> JournalLock:
        """Take the journal's lock without waiting.

        Args:
            journal: the journal file (the lock is its ``.lock`` sibling).

        Returns:
            The held lock.

        Raises:
            JournalBusy: another process holds it; the message names its pid.
            JournalError: the lock file cannot be created or locked.
        """
        path = lock_path(journal)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise JournalError(
                f"journal {journal}: cannot create its lock file {path} "
                f"({exc.strerror or exc}); check that the directory is "
                "writable"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise JournalBusy(
                f"journal {journal} is held by another master (pid {holder}); "
                "stop that master first, or give another --journal"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise JournalError(
                f"journal {journal}: cannot lock {path} "
                f"({exc.strerror or exc}); put the journal on a local file "
                "system"
            ) from exc
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the pid is only for the refusal message; the lock is what counts
        return cls(fd, path)

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Free the lock. Releasing twice is fine."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock

    def __del__(self) -> None:
        # A journal dropped without close() must not keep its journal locked in this process.
        self.release()


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"
