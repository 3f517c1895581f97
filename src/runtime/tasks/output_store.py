"""Exactly-once task outputs: write aside, then commit by an atomic rename keyed by task id.

A worker stages a task's output in a private directory under ``root/.staging`` and commits it
with one ``os.rename`` onto ``root/committed/<task_id>``. A reader therefore sees either the
whole output or nothing, and a second commit of the same task (a retry after a lost ack, a
speculative copy on another worker) finds the target taken and becomes a no-op::

    store = OutputStore(root)
    with store.stage(task.id) as staged:
        (staged.path / "frames.parquet").write_bytes(data)
        staged.commit()  # True: this call committed; False: the task was already committed

Why rename alone is enough: renaming a directory onto an existing *non-empty* directory fails
(ENOTEMPTY or EEXIST), so of two concurrent commits exactly one wins, even across processes.
Renaming onto an *empty* directory would succeed, so every commit first writes the marker file
``.troupe-commit`` into its staging directory: a committed output is never empty.

Leaving the ``with`` block without committing, or with an exception, deletes the staging
directory. Any ``OSError`` met while staging or committing (disk full, permissions) is raised
as :class:`~troupe.runtime.errors.CommitError`, naming the task and the fix, after the staging
directory has been removed; nothing becomes visible and the task can simply be retried.

A writer killed while staging cannot clean up: so each staging directory's name carries its
writer (pid, process start tick, and a tag of the host and pid namespace), and every store
opened sweeps the staging directories whose writer on this host is dead
(:meth:`OutputStore.sweep_abandoned`). The start is a tick count since boot, not a time: a
clock step changes every process's start time as psutil reads it, and a live writer's staging
directory was then swept from under it (``process_start.py``). Entries it cannot judge (written
from another host or container, or by an older troupe, whose names carry a time) are removed
only once untouched for ``stale_after_s``.

A committed output can still be damaged later, on disk (a file cut short or deleted): the
marker lists each committed file with its size, :meth:`OutputStore.damage` compares them, and
:meth:`OutputStore.set_aside` moves a damaged output out of the committed ones, so that its
task is made again rather than read as it is (the LeRobot writer does both as a run starts).

:func:`atomic_file` is the same promise for one file: written to a temporary sibling, then
``os.replace``-d over the destination, so a crash never leaves half a file.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from troupe.runtime.core.config_messages import short_repr
from troupe.runtime.errors import CommitError, InvalidTaskId, TaskError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.process_start import start_ticks

__all__ = [
    "COMMIT_MARKER",
    "DAMAGED_DIR",
    "STALE_AFTER_S",
    "OutputStore",
    "OutputStoreStats",
    "Staged",
    "as_commit_error",
    "atomic_file",
    "fsync_path",
    "replace_durably",
]

log = get_logger(__name__)

COMMIT_MARKER = ".troupe-commit"
"""File written into every committed output; it keeps the dir non-empty and holds the task id,
then ``SIZE PATH`` of each file committed with it (a later look finds one cut short or gone)."""
DAMAGED_DIR = ".damaged"
"""Where :meth:`OutputStore.set_aside` moves a committed output found damaged."""

_TAKEN = (errno.ENOTEMPTY, errno.EEXIST)
# <task_id>.<16 hex>.<pid>-t<start tick>-<scope>: the writer of a staging directory
_WRITER = re.compile(r"\.[0-9a-f]{16}\.(\d+)-t(\d+)-([0-9a-f]{8})$")
# A file name holds 255 bytes; a staging directory's adds up to ~55 to the id (``_WRITER``).
TASK_ID_MOST_BYTES = 200
STALE_AFTER_S = 24 * 3600.0
"""Staging entries whose writer cannot be checked are removed once untouched this long."""


@functools.cache
def _scope() -> str:
    """This host and pid namespace: pids are only comparable within one of them."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return hashlib.sha256(f"{socket.gethostname()}/{namespace}".encode()).hexdigest()[:8]


@functools.cache
def _writer_tag(pid: int) -> str:
    """``<pid>-t<start tick>-<scope>`` of this process (cached per pid: a fork gets its own)."""
    return f"{pid}-t{start_ticks(pid)}-{_scope()}"


def _writer_alive(pid: int, start: int) -> bool:
    """Whether the process that wrote a staging entry on this host still runs (a pid reused by
    another process starts at another tick)."""
    return start_ticks(pid) == start


@dataclass(frozen=True)
class OutputStoreStats:
    """Counters of one :class:`OutputStore` object since it was created.

    Attributes:
        commits: outputs this object committed.
        duplicate_commits: commits that found the task already committed (no-ops).
        aborted: staging directories dropped without a commit (exception or no commit call).
        failed: stage or commit attempts that raised :class:`CommitError`.
    """

    commits: int
    duplicate_commits: int
    aborted: int
    failed: int


def _validate_task_id(task_id: str) -> str:
    if not isinstance(task_id, str) or not task_id:
        raise InvalidTaskId(f"task id {task_id!r} is empty or not a string; give a non-empty str")
    if task_id.startswith("."):
        raise InvalidTaskId(f"task id {task_id!r} starts with a dot; drop the leading dot")
    size = len(task_id.encode("utf-8", "surrogatepass"))
    if size > TASK_ID_MOST_BYTES:
        raise InvalidTaskId(
            f"task id {short_repr(task_id)} is {size} bytes long; it names a directory (its staging "
            f"one with a suffix), so give at most {TASK_ID_MOST_BYTES}"
        )
    bad = [c for c in ("/", "\\", os.sep, os.altsep or "/", "\0") if c in task_id]
    if bad:
        raise InvalidTaskId(
            f"task id {task_id!r} holds {bad[0]!r}; a task id names one directory, "
            "so replace path separators (e.g. with '-')"
        )
    return task_id


def _fix_for(exc: OSError, root: Path) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        inodes = _inodes_short(root)
        if inodes is not None:  # "free space" sent the user to a disk 99% free
            return (
                f"free inodes on the volume holding {root}: {inodes}, though it has room for bytes "
                "(df -i; delete small files there, or point the store at a volume with more)"
            )
        return f"free space on the volume holding {root} (or point the store at a larger one)"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"make {root} writable by this user (uid {os.getuid()})"
    # No rerun gets past it: it must be moved (a rename's target is its second name).
    in_the_way = exc.filename2 or exc.filename
    if exc.errno in _IN_THE_WAY and in_the_way:
        return f"move or delete {in_the_way}, which is in the way"
    return f"check the volume holding {root}"


def _inodes_short(root: Path) -> str | None:
    """How few inodes the volume holding ``root`` has left (``3 of 120 free``) where it is out
    of them, or nearly (a commit makes several files at once), rather than of bytes; None where
    it is not, or cannot say (no inode count: btrfs; nothing of the path exists)."""
    path = root
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    if st.f_files <= 0 or st.f_favail > max(_FEW_INODES, st.f_files // 1000):
        return None
    return f"{st.f_favail} of {st.f_files} free"


_FEW_INODES = 64  # fewer than a few commits' files


# A folder where a file goes, a file where a folder goes, a folder that is not empty.
_IN_THE_WAY = (errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENOTEMPTY)


def as_commit_error(
    exc: OSError,
    *,
    action: str,
    root: Path,
    task_id: str = "",
    retry: str = "retry the task",
    kept: str = "Nothing was committed.",
) -> CommitError:
    """Translate an OSError met while writing an output into a CommitError that says the fix.

    Args:
        exc: the OS error (its errno is kept).
        action: what was being done, e.g. "committing the output".
        root: the directory being written, named in the fix.
        task_id: the task, if any; kept as the error's ``task_id`` attribute.
        retry: what to do once the cause is fixed.
        kept: what the failure left as it was (a finalize that moved some files into place
            committed something: it says what is whole).

    Returns:
        The error to raise (``from exc``).
    """
    subject = f"task {task_id!r}: " if task_id else ""
    err = CommitError(
        exc.errno or errno.EIO,
        f"{subject}{action} failed ({exc.strerror or exc}); {_fix_for(exc, root)}, then {retry}. {kept}",
    )
    err.task_id = task_id  # type: ignore[attr-defined]
    return err


def _commit_error(task_id: str, action: str, exc: OSError, root: Path) -> CommitError:
    return as_commit_error(exc, action=action, root=root, task_id=task_id)


def fsync_path(path: Path) -> None:
    """Flush ``path`` (a file, or a folder's entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _marker(task_id: str, staged: Path) -> str:
    """The commit marker's text: the task id, then ``SIZE PATH`` of every file staged."""
    lines = [task_id]
    for file in sorted(f for f in staged.rglob("*") if f.is_file() and not f.is_symlink()):
        lines.append(f"{file.stat().st_size} {file.relative_to(staged).as_posix()}")
    return "\n".join(lines) + "\n"


def _fsync_tree(top: Path) -> None:
    # Files first, then their directories bottom-up, so the rename publishes durable content.
    for dirpath, _dirnames, filenames in os.walk(top, topdown=False):
        for name in filenames:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))


class Staged:
    """A private directory holding one task's output until :meth:`commit`; a context manager.

    Attributes:
        task_id: the task whose output this is.
        path: the private staging directory; write the output files here.
    """

    def __init__(self, store: OutputStore, task_id: str, path: Path) -> None:
        self._store = store
        self.task_id = task_id
        self.path = path
        self._finished = False

    def __enter__(self) -> Staged:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._finished:
            return
        self._finished = True
        if isinstance(exc, OSError) and not isinstance(exc, CommitError):
            self._store.discard(self, "failed")
            raise _commit_error(self.task_id, "writing the output aside", exc, self._store.root) from exc
        self._store.discard(self, "aborted")
        log.info("output_aborted", task_id=self.task_id, error=repr(exc) if exc else None)

    def commit(self) -> bool:
        """Publish the staged output under the task id, exactly once.

        Returns:
            True if this call committed the output; False if the task was already committed
            (the staged copy is removed and the committed one is left untouched).

        Raises:
            CommitError: an OSError (disk full, permissions) stopped the commit; the staging
                directory is removed and nothing is visible.
            TaskError: this staging area was already committed or dropped.
        """
        if self._finished:
            raise TaskError(
                f"task {self.task_id!r}: this staging area is already finished; "
                "call OutputStore.stage() again for a new attempt"
            )
        self._finished = True
        store = self._store
        target = store.committed_path(self.task_id)
        try:
            if target.exists():
                return self._duplicate()
            (self.path / COMMIT_MARKER).write_text(_marker(self.task_id, self.path), encoding="utf-8")
            if store.durable:
                _fsync_tree(self.path)
            try:
                os.rename(self.path, target)
            except OSError as exc:
                if exc.errno in _TAKEN:
                    return self._duplicate()
                raise
            if store.durable:
                fsync_path(store.committed_dir)
                fsync_path(store.staging_dir)
        except OSError as exc:
            store.discard(self, "failed")
            log.warning("output_commit_failed", task_id=self.task_id, error=str(exc))
            raise _commit_error(self.task_id, "committing the output", exc, store.root) from exc
        store.settle(self, "commits")
        log.info("output_committed", task_id=self.task_id)
        return True

    def _duplicate(self) -> bool:
        self._store.discard(self, "duplicate_commits")
        log.info("output_duplicate", task_id=self.task_id)
        return False


class OutputStore:
    """Task outputs, each committed at most once, never visible half-written.

    Layout: ``root/.staging/<task_id>.<random>.<writer>/`` while a writer works, then
    ``root/committed/<task_id>/`` once committed. Thread-safe; several processes (and hosts on
    a shared POSIX file system with atomic rename) may use the same root.

    Args:
        root: directory of the store; created if missing.
        durable: fsync files and directories around the rename so a committed output survives a
            power loss. Turn off only for throwaway data.
        sweep: remove abandoned staging directories now (:meth:`sweep_abandoned`).
        stale_after_s: how long an entry whose writer cannot be checked must be untouched
            before a sweep removes it.

    Raises:
        CommitError: the store directories cannot be created.
    """

    def __init__(
        self,
        root: Path,
        *,
        durable: bool = True,
        sweep: bool = True,
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        self.root = Path(root)
        self.durable = durable
        self.staging_dir = self.root / ".staging"
        self.committed_dir = self.root / "committed"
        try:
            self.staging_dir.mkdir(parents=True, exist_ok=True)
            self.committed_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _commit_error("", "creating the output store", exc, self.root) from exc
        self.stale_after_s = stale_after_s
        self._lock = threading.Lock()
        self._live: set[Path] = set()
        self._counts = {"commits": 0, "duplicate_commits": 0, "aborted": 0, "failed": 0}
        if sweep:
            self.sweep_abandoned()

    def stage(self, task_id: str) -> Staged:
        """Open a fresh private staging directory for one attempt at a task's output.

        Args:
            task_id: the task; no path separators, not empty, no leading dot.

        Returns:
            A :class:`Staged` context manager whose ``path`` exists and is empty.

        Raises:
            InvalidTaskId: the task id cannot name a directory.
            CommitError: the staging directory cannot be created.
        """
        _validate_task_id(task_id)
        path = self.staging_dir / f"{task_id}.{secrets.token_hex(8)}.{_writer_tag(os.getpid())}"
        try:
            path.mkdir()
        except OSError as exc:
            self._count("failed")
            raise _commit_error(task_id, "creating the staging directory", exc, self.root) from exc
        with self._lock:
            self._live.add(path)
        return Staged(self, task_id, path)

    def is_committed(self, task_id: str) -> bool:
        """Return whether the task's output is committed."""
        return self.committed_path(task_id).is_dir()

    def committed_path(self, task_id: str) -> Path:
        """Return where the task's committed output lives (whether or not it exists yet).

        Raises:
            InvalidTaskId: the task id cannot name a directory.
        """
        return self.committed_dir / _validate_task_id(task_id)

    def committed(self) -> list[str]:
        """Return the ids of every committed task, sorted."""
        return sorted(p.name for p in self.committed_dir.iterdir() if p.is_dir())

    def damage(self, task_id: str) -> str | None:
        """What is wrong with the committed output of ``task_id``, by its commit marker's list
        of files and sizes: a file gone or of another size (cut short, say); None when nothing
        is, or when the marker lists no file (written by an older troupe: nothing to compare).
        Bytes changed in place, the size kept, are not seen: that would mean reading them all.
        """
        path = self.committed_path(task_id)
        try:
            lines = (path / COMMIT_MARKER).read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return f"its {COMMIT_MARKER} marker is gone"
        for line in lines[1:]:
            size, _, name = line.partition(" ")
            if not size.isdigit() or not name:
                return f"its {COMMIT_MARKER} marker is damaged"
            try:
                now = (path / name).stat().st_size
            except FileNotFoundError:
                return f"{name} is gone"
            if now != int(size):
                return f"{name} is {now} bytes, {size} when it was committed"
        return None

    def set_aside(self, task_id: str) -> Path:
        """Move the committed output of ``task_id`` out of the committed ones (to
        ``root/.damaged/<task_id>``, replacing one set aside before): its task is no longer
        committed, and may be made again. Returns where it went."""
        aside = self.root / DAMAGED_DIR / _validate_task_id(task_id)
        aside.parent.mkdir(parents=True, exist_ok=True)
        if aside.exists():
            shutil.rmtree(aside)
        os.rename(self.committed_path(task_id), aside)
        log.warning("output_set_aside", task_id=task_id, to=str(aside))
        return aside

    def clear(self) -> int:
        """Remove every committed output and every staged one not open here (a fresh start).

        Returns:
            The number of committed outputs removed.
        """
        removed = 0
        for entry in list(self.committed_dir.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed += 1
        shutil.rmtree(self.root / DAMAGED_DIR, ignore_errors=True)
        self.sweep_staging()
        if removed:
            log.info("store_cleared", removed=removed, root=str(self.root))
        return removed

    def sweep_staging(self, *, older_than: float | None = None) -> int:
        """Remove staging directories left by crashed writers.

        Directories staged by this object and still open are never removed. Other writers
        (processes) may be staging right now: pass ``older_than`` to spare recent ones.

        Args:
            older_than: remove only entries whose mtime (epoch seconds) is before this; None
                removes every entry not open in this object.

        Returns:
            The number of entries removed.
        """
        with self._lock:
            live = set(self._live)
        removed = 0
        for entry in self.staging_dir.iterdir():
            if entry in live:
                continue
            try:
                if older_than is not None and entry.lstat().st_mtime >= older_than:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            except FileNotFoundError:
                continue  # its writer finished or another sweeper got there first
            removed += 1
        if removed:
            log.info("staging_swept", removed=removed, root=str(self.root))
        return removed

    def sweep_abandoned(self) -> int:
        """Remove the staging directories of writers that died (a worker killed mid-task).

        An entry is removed when its name says it was written on this host (and pid
        namespace) by a process that no longer runs (a reused pid is told apart by its start
        time), or, when its writer cannot be checked (another host or container, an older
        naming), when it was untouched for ``stale_after_s``. Entries this object has open,
        and those of live writers, stay. A failure to remove one is logged, never raised: a
        store that opens must not fail over leftovers.

        Returns:
            The number of entries removed.
        """
        with self._lock:
            live = set(self._live)
        scope, stale_before = _scope(), time.time() - self.stale_after_s
        removed = 0
        try:
            entries = list(self.staging_dir.iterdir())
        except OSError as exc:
            log.warning("staging_sweep_failed", root=str(self.root), error=str(exc))
            return 0
        for entry in entries:
            if entry in live:
                continue
            match = _WRITER.search(entry.name)
            try:
                if match is not None and match[3] == scope:
                    if _writer_alive(int(match[1]), int(match[2])):
                        continue
                elif entry.lstat().st_mtime >= stale_before:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    # Claim it first, so that of two sweepers one removes it and the other
                    # skips it; the claimed name carries this writer, should it die meanwhile.
                    claimed = self.staging_dir / (f"swept.{secrets.token_hex(8)}.{_writer_tag(os.getpid())}")
                    os.rename(entry, claimed)
                    shutil.rmtree(claimed)
                else:
                    entry.unlink()
            except FileNotFoundError:
                continue  # another sweeper took it
            except OSError as exc:
                log.warning("staging_sweep_failed", root=str(self.root), entry=entry.name, error=str(exc))
                continue
            removed += 1
        if removed:
            log.info("staging_abandoned_swept", removed=removed, root=str(self.root))
        return removed

    def statistics(self) -> OutputStoreStats:
        """Return this object's commit counters."""
        with self._lock:
            return OutputStoreStats(**self._counts)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def settle(self, staged: Staged, outcome: str) -> None:
        """A staging area ended as ``outcome`` (a counter of :class:`OutputStoreStats`) with its
        directory gone (renamed into place): stop tracking it, count the outcome."""
        with self._lock:
            self._live.discard(staged.path)
        self._count(outcome)

    def discard(self, staged: Staged, outcome: str) -> None:
        """A staging area ended as ``outcome`` without being published: remove its directory,
        stop tracking it, count the outcome."""
        shutil.rmtree(staged.path, ignore_errors=True)
        self.settle(staged, outcome)


def replace_durably(src: Path, dest: Path, *, durable: bool = True) -> None:
    """Move the finished file ``src`` to ``dest`` (same file system) with ``os.replace``, the
    file fsynced before and ``dest``'s directory after (``durable``): on disk once it returns.

    Raises:
        OSError: the replace failed (another file system: ``EXDEV``), or an fsync did.
    """
    if durable:
        fsync_path(src)
    os.replace(src, dest)
    if durable:
        fsync_path(dest.parent)


@contextmanager
def atomic_file(path: Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling path to write; on success it replaces ``path`` atomically.

    On an exception the temporary file is removed and ``path`` is left as it was.

    Args:
        path: the destination file; its parent directory is created if missing.
        durable: fsync the file and its directory around the replace.

    Raises:
        OSError: writing or replacing failed (callers translate it at their boundary).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        yield tmp
        replace_durably(tmp, path, durable=durable)
    finally:
        if tmp.exists():
            tmp.unlink()
