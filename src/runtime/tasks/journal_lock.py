"""One master per journal: an exclusive OS lock on a sidecar file, held while the journal is open.

Two masters serving one journal would both lease its tasks. :class:`JournalLock` takes
``fcntl.flock`` on ``<journal>.lock`` beside the real file, symlinks resolved, so a symlink to the
journal takes the same lock. The kernel releases a flock when its holder dies, however it dies, so a
master killed with SIGKILL never leaves a stale lock behind and a rerun starts at once. The
holder writes its pid into the file, only so that the refusal can name it; the file itself is
never deleted (deleting it would let a third process lock a fresh file while the first still
holds the old one).

A hard link to the journal has a name, and so a sidecar, of its own: the lock also takes a flock
on the journal file itself, wherever it exists (:meth:`JournalLock.cover`: as the lock is taken,
and again once SQLite has created the file), so that every path to the same file (its device
and inode) is refused. A flock is not SQLite's kind of lock (``fcntl`` record locks, which it
takes and drops on that file): on a local file system (where a journal in WAL mode must be) the
two never meet, and SQLite closing its own descriptors leaves the flock held. The other way
round, closing a descriptor of the file drops every record lock this process holds on it,
SQLite's too: so the lock closes its own only once the journal is closed, and never opens the
file where this process holds it already (refused, naming this process, from a table of the
files held here). Where the holder is another process, its pid is read from the kernel's table
of locks (``/proc/locks``; ``unknown`` where there is none).

The descriptors are close-on-exec, so worker processes a master starts do not inherit the lock.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from troupe.runtime.errors import JournalError
from troupe.runtime.file_owner import belongs_to
from troupe.runtime.flock_holder import flock_holder

__all__ = ["JournalBusy", "JournalLock", "lock_path", "refuse_held"]


class JournalBusy(JournalError):
    """Another process (a master, ``troupe run``, ``master compact``) holds the journal."""


def lock_path(journal: Path) -> Path:
    """Return the sidecar lock file of a journal: beside the file itself, symlinks resolved, so
    that a symlink to a journal (or to its folder) takes the same lock as the journal."""
    real = Path(os.path.realpath(journal))
    return real.with_name(real.name + ".lock")


def refuse_held(journal: Path) -> None:
    """Refuse ``journal`` where another process holds its lock now, read from the kernel's table
    (``flock_holder``): nothing is made, opened for writing or locked, so a master taking the lock
    at this instant is not refused for it. A master refused for another reason first (its log
    name, held by the same master) says the journal's, which names the cause.

    Raises:
        JournalBusy: the journal's lock is held; the message names the holder's pid. Off Linux
            (no table) nothing is raised.
    """
    for held in (lock_path(journal), journal):  # the file itself too: a hard link's sidecar is its own
        try:
            st = os.stat(held)
        except OSError:
            continue
        holder = flock_holder(st)
        if holder is not None:
            raise _busy(journal, holder)


# The journal files this process holds a flock on, by (st_dev, st_ino): one is never opened
# again here (closing that descriptor would drop SQLite's record locks on it in this process).
# Reentrant: a lock dropped without release, collected as this table is read, frees its entry.
_held_here: set[tuple[int, int]] = set()
_held_here_lock = threading.RLock()


class JournalLock:
    """The held lock of one journal. Use :meth:`acquire`; :meth:`release` (or dropping it) frees it.

    Args:
        fd: the open, locked descriptor of the lock file.
        path: the lock file.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path
        self._file: tuple[int, tuple[int, int]] | None = None  # the journal file's: fd, identity

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
            # 0o666: the umask decides, as for the rest of the folder (a group-shared run folder)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except PermissionError as exc:
            raise _not_writable(journal, path, exc) from exc
        except OSError as exc:
            raise JournalError(
                f"journal {journal}: cannot create its lock file {path} "
                f"({exc.strerror or exc}); check that the directory is "
                "writable"
            ) from exc
        _flock(fd, journal, str(path), lambda: _read_pid(fd))
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the pid is only for the refusal message; the lock is what counts
        lock = cls(fd, path)
        try:
            lock.cover(journal)
        except BaseException:
            lock.release()
            raise
        return lock

    def cover(self, journal: Path) -> None:
        """Hold the journal file itself too, where it exists (a journal not made yet is covered
        once it is: call this again then), so that a hard link to it is refused: its other name
        has a lock file of its own. The file covered before (one set aside, or deleted) is let
        go once this one is held.

        Raises:
            JournalBusy: another holder (a master, this process included) holds the file under
                another name; the message names its pid.
            JournalError: the file cannot be opened to lock it.
        """
        try:
            st = os.stat(journal)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise JournalError(f"journal {journal}: cannot read it ({exc.strerror or exc})") from exc
        if not stat.S_ISREG(st.st_mode):
            return  # Journal.open refuses it; nothing SQLite would open is locked through it
        identity = (st.st_dev, st.st_ino)
        if self._file is not None and self._file[1] == identity:
            return
        with _held_here_lock:
            if identity in _held_here:
                raise _busy(journal, str(os.getpid()))
            try:
                fd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise JournalError(
                    f"journal {journal}: cannot open it to lock it ({exc.strerror or exc}); check "
                    "that it is readable"
                ) from exc
            # Closed on a refusal: no record lock of this process is on it (the table says none).
            _flock(fd, journal, "it", lambda: flock_holder(st) or "unknown")
            _held_here.add(identity)
        self._let_go_of_file()
        self._file = (fd, identity)

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Free the lock. Releasing twice is fine. Close the journal's connection first: closing
        the lock's descriptor of the file drops this process's record locks on it (SQLite's)."""
        self._let_go_of_file()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock

    def _let_go_of_file(self) -> None:
        held, self._file = self._file, None
        if held is not None:
            fd, identity = held
            with _held_here_lock:
                os.close(fd)
                _held_here.discard(identity)

    def __del__(self) -> None:
        # A journal dropped without close() must not keep its journal locked in this process.
        self.release()


def _flock(fd: int, journal: Path, what: str, holder: Callable[[], str]) -> None:
    """Take ``fd``'s flock without waiting; on a refusal ``fd`` is closed and the error names
    ``holder()`` (another holder) or ``what`` could not be locked (``JournalError``)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        who = holder()
        os.close(fd)
        raise _busy(journal, who) from None
    except OSError as exc:
        os.close(fd)
        raise JournalError(
            f"journal {journal}: cannot lock {what} ({exc.strerror or exc}); put the journal on a "
            "local file system"
        ) from exc


def _not_writable(journal: Path, path: Path, exc: OSError) -> JournalError:
    """The refusal where this user may not open the lock file for writing. One that exists (another
    user's, made under a stricter umask) is looked at read-only: held now, it is the holder that is
    named, as for a lock file this user may write (it said "check that the directory is writable"
    of a writable one); else its owner and mode are."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # not there: the directory is what this user may not write
        return JournalError(
            f"journal {journal}: cannot create its lock file {path} ({exc.strerror or exc}); check "
            "that the directory is writable"
        )
    try:
        st = os.fstat(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # refused while a holder has LOCK_EX
        except BlockingIOError:
            return _busy(journal, _read_pid(fd))
        except OSError:
            pass
    finally:
        os.close(fd)
    return JournalError(
        f"journal {journal}: cannot write its lock file {path} ({exc.strerror or exc}; "
        f"{belongs_to(st)}); its owner may let this user write it, or remove it while no run or "
        "master uses the journal"
    )


def _busy(journal: Path, holder: str) -> JournalBusy:
    return JournalBusy(
        f"journal {journal} is held by another master (pid {holder}); "
        "stop that master first, or give another --journal"
    )


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"
