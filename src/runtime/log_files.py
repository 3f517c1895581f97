"""A node's log files on disk: their names, rotation by size, and the writers that follow it.

Every process of a node appends to ``<logs>/<node>.jsonl`` (O_APPEND: one ``write`` per line,
never interleaved). Rotation by size is safe across those processes, and holds to the size:

- Every writer (:class:`ReopeningFileHandler` given ``max_bytes``: the node, its supervisor,
  each worker, a master started on its own) looks, before each line, where the end of the file
  it appends to is (one ``lseek``, about 1% of a line's cost; a ``stat`` costs twice that, and a
  look every so many lines let a burst of every process overshoot the size by all it wrote in
  between). Where the line would take the file past ``max_bytes``, the writer rotates it first
  (:func:`rotate`: ``.jsonl`` to ``.jsonl.1``, ``.1`` to ``.2`` ..., the oldest beyond ``keep``
  deleted) under an exclusive ``flock`` of ``<node>.jsonl.lock`` (:func:`rotation_lock`), having
  looked again under it that the path still names that file and the line still does not fit:
  another writer may have rotated it a moment before, and this one then only reopens the path.
- So a rotated file holds at most ``max_bytes`` (or one line alone that is longer), plus at most
  one line of each other process that wrote in the same instant: a writer's look and its write
  are two steps, and another's line may land between them.
- A rename never loses a line: a process that still has the old file open keeps appending to
  it, now under the name ``.1``, as long as its lines fit there, and looks at most once per
  :data:`REOPEN_CHECK_S` whether the path still names the file it has open (device and inode),
  reopening the path when it does not; that look also follows a rotation made by another tool.
  A line lands in a file deleted beyond ``keep`` only if ``keep`` rotations come within that look.
- The node's log stream rotates the file too (:func:`rotate_if_larger`, on its poll), under the
  same lock, for what a process that does not rotate (a program running a node in its own
  process) wrote past the size.
- Each rotation counts itself, under the lock, in ``<node>.rotations`` (:func:`rotations_path`,
  :func:`rotation_count`): a reader that held a file deleted past ``keep`` before it read on
  tells from the count whether a file between went unread too, where the times of the files
  cannot (a burst rotates many times within a clock tick). The count is one decimal number and a
  newline, written in place: twice the rotations finished, plus one while a rotation is under
  way (a reader trusts two equal even looks around its ``open``). A rotation that died or failed
  midway counts as one when the next starts, so the count may run ahead of the renames, never
  behind them: a reader may say in vain that lines may be missing, never keep quiet about lost
  ones. No count file is no rotation counted yet (an older troupe rotates without counting: its
  readers are left to the files' times); one that holds no count leaves readers to them too.
  The name is not ``<node>.jsonl``'s with a suffix, as the lock's is: ``cat <node>.jsonl*`` would
  take the number for a line of the log.
- A reader follows the file across those rotations, and across a cut in place
  (:mod:`troupe.runtime.log_follower`); :func:`last_lines` reads the last lines of them all at once.

A file that cannot be rotated (its folder not writable, a directory where the lock file goes)
grows on past the size: its writers say so once each on stderr and try again a
:data:`REOPEN_CHECK_S` later, rather than at every line.

Every line in the file stays whole JSON, a full disk included: a writer writes each record with
one ``write`` on an unbuffered descriptor, so nothing of a line that failed is held back to be
written later in front of another; a write the disk cut short (it filled mid-line) is taken
back, the file cut to where that line began, when no other process has appended after it in
the same moment (their writes fail as well: the disk is full).

A log file that cannot be written (a full disk, a directory in its place, a file this user may
not write, a symbolic link: a writer does not follow one, which in a folder another user may
write could name any file of ours) costs its lines, not the terminal nor the process: each
writer (the node, its supervisor, each worker: a process that alone could not write says it)
says so once on stderr, in one line naming the process, and again only after a write has
succeeded in between (logging's default prints a traceback for every line, which buried the
run's own error). One that cannot be read costs a reader that file's lines only
(:mod:`troupe.runtime.log_follower`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = [
    "REOPEN_CHECK_S",
    "ReopeningFileHandler",
    "file_ident",
    "history_files",
    "last_lines",
    "lock_path",
    "rotate",
    "rotate_if_larger",
    "rotated_path",
    "rotation_count",
    "rotation_lock",
    "rotations_path",
]

REOPEN_CHECK_S = 1.0  # a writer notices a rotation within this long


def rotated_path(path: Path, k: int) -> Path:
    """The ``k``-th rotated file of ``path`` (``node.jsonl.k``; 1 is the newest)."""
    return path.with_name(f"{path.name}.{k}")


def lock_path(path: Path) -> Path:
    """The file whose ``flock`` every process takes to rotate ``path`` (``node.jsonl.lock``)."""
    return path.with_name(f"{path.name}.lock")


def rotations_path(path: Path) -> Path:
    """The file that counts ``path``'s rotations (``node.rotations``; see the module)."""
    return path.with_suffix(".rotations")


_held_locks: set[int] = set()  # descriptors of rotation locks this process holds now


def _forget_held_locks() -> None:
    """In a child forked while a thread held a rotation lock: its copy of the descriptor would
    hold the lock (a ``flock`` belongs to the open file, not the process) for as long as the
    child lives, and every writer of the file would wait at its next rotation."""
    for fd in _held_locks:
        with contextlib.suppress(OSError):
            os.close(fd)
    _held_locks.clear()


os.register_at_fork(after_in_child=_forget_held_locks)


@contextlib.contextmanager
def rotation_lock(path: Path, wait: bool = True) -> Iterator[bool]:
    """Hold the exclusive lock under which ``path`` is rotated (see the module): True inside;
    False where ``wait`` is False and another process holds it.

    The lock file is made where missing and stays (a link in its place is not followed).

    Raises:
        OSError: the lock file cannot be opened or locked.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(lock_path(path), flags, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            locked = False
        if locked:
            _held_locks.add(fd)
        yield locked
    finally:
        _held_locks.discard(fd)
        os.close(fd)  # releases the lock


def rotate(path: Path, keep: int) -> None:
    """Roll ``path`` to ``path.1``, ``path.1`` to ``path.2``..., deleting what is beyond ``keep``.

    The next write by any process (re)creates ``path``. The caller holds :func:`rotation_lock`
    where other processes may rotate ``path`` too, and has looked under it that ``path`` still
    needs rotating.

    Raises:
        ValueError: ``keep`` is below 1.
        OSError: a rename failed (the files are left as consistent as the failure allows).
    """
    if keep < 1:
        raise ValueError(f"keep must be 1 or more, got {keep}")
    with _counted(path):
        rotated_path(path, keep).unlink(missing_ok=True)
        for k in range(keep - 1, 0, -1):
            older = rotated_path(path, k)
            if older.exists():
                os.replace(older, rotated_path(path, k + 1))
        os.replace(path, rotated_path(path, 1))


_COUNT_BYTES = 32  # more than a count's digits and newline can take


def rotation_count(path: Path) -> int | None:
    """How many times :func:`rotate` rotated ``path``, as :func:`rotations_path` counts them (see
    the module); None while a rotation is under way, and where there is no count to read (the
    file holds none, or cannot be read).

    A reader that looks before and after opening ``path`` and gets one number both times knows
    which file it opened: the one made after that many rotations.
    """
    try:
        fd = os.open(rotations_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0  # no rotation counted yet
    except OSError:
        return None
    try:
        mark = _read_mark(fd)
    finally:
        os.close(fd)
    return None if mark is None or mark % 2 else mark // 2


def _read_mark(fd: int) -> int | None:
    """The count as written (odd while a rotation is under way); None where none is."""
    try:
        data = os.pread(fd, _COUNT_BYTES, 0)
    except OSError:
        return None
    digits = data[:-1]
    return int(digits) if data.endswith(b"\n") and digits.isdigit() else None


@contextlib.contextmanager
def _counted(path: Path) -> Iterator[None]:
    """Count the rotation made inside in :func:`rotations_path` (see the module): odd from before
    its first rename, even after its last; left odd where it raised.

    The count is kept as well as it can be, not at the rotation's cost: a count that cannot be
    written (a full disk) is emptied, leaving readers to the files' times, and the rotation goes
    on (it deletes the oldest file, which frees room).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd: int | None = os.open(rotations_path(path), flags, 0o666)
    except OSError:  # a directory in its place, say: readers are left to the files' times
        fd = None
    if fd is None:
        yield
        return
    try:
        started = ((_read_mark(fd) or 0) + 1) | 1  # a rotation that died midway counts as one
        _write_mark(fd, started)
        yield
        _write_mark(fd, started + 1)
    finally:
        os.close(fd)


def _write_mark(fd: int, mark: int) -> None:
    data = b"%d\n" % mark
    try:
        os.pwrite(fd, data, 0)
        if os.fstat(fd).st_size > len(data):  # something other than a count was there
            os.ftruncate(fd, len(data))
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)


def rotate_if_larger(path: Path, max_bytes: int, keep: int) -> bool:
    """Rotate ``path`` when it holds ``max_bytes`` or more; return whether it rotated.

    Under :func:`rotation_lock`, not waited for: a process holding it is rotating the file now.

    Raises:
        OSError: the lock file cannot be opened, or a rename failed.
    """
    if _size(path) < max_bytes:
        return False
    with rotation_lock(path, wait=False) as locked:
        if not locked or _size(path) < max_bytes:  # rotated by a writer meanwhile
            return False
        rotate(path, keep)
    return True


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def history_files(path: Path) -> list[Path]:
    """``path``'s rotated files and then ``path`` itself, oldest first; only those that exist."""
    rotated: list[tuple[int, Path]] = []
    for candidate in path.parent.glob(f"{path.name}.*"):
        suffix = candidate.name[len(path.name) + 1 :]
        if suffix.isdigit():
            rotated.append((int(suffix), candidate))
    files = [p for _, p in sorted(rotated, reverse=True)]
    return [*files, path] if path.exists() else files


def last_lines(files: list[Path], n: int, keep: Callable[[bytes], bool] = lambda _: True) -> list[bytes]:
    """The last ``n`` complete lines of ``files`` (oldest first) that ``keep`` accepts.

    Reads newest file first and stops as soon as it has ``n``: the rotated files of a long run
    are only read when the newer ones hold too few matching lines.
    """
    if n <= 0:
        return []
    found: list[bytes] = []
    for path in reversed(files):
        try:
            data = path.read_bytes()
        except OSError:  # rotated away between listing and reading, or not a file it can read
            continue
        complete = data[: data.rfind(b"\n") + 1] if path is files[-1] else data
        lines = [ln for ln in complete.split(b"\n") if ln and keep(ln)]
        found = lines[-(n - len(found)) :] + found
        if len(found) >= n:
            break
    return found


def file_ident(st: os.stat_result) -> tuple[int, int]:
    """Which file a status is of (its device and inode), whatever its name now."""
    return st.st_dev, st.st_ino


class ReopeningFileHandler(logging.Handler):
    """A file handler that follows the rotation of its file by another process (or by itself).

    Each record is one ``write`` of its bytes on an unbuffered O_APPEND descriptor (see the
    module): the buffered stream of logging's FileHandler kept the unwritten tail of a line the
    disk cut short and wrote it, once there was room again, glued in front of the next record.

    Args:
        path: the file, opened for appending (created when missing).
        max_bytes: with a value, this handler rotates the file before a line that would take
            it past that size, under the rotation lock, whoever else writes it (see the
            module); None only follows the rotations others make.
        keep: rotated files kept when this handler rotates.
        who: the process, named in what stderr is told (``process w1``), where several
            processes write one file.
    """

    terminator = "\n"

    def __init__(
        self, path: Path, max_bytes: int | None = None, keep: int = 5, who: str | None = None
    ) -> None:
        super().__init__()
        self.baseFilename = os.path.abspath(path)
        self.max_bytes = max_bytes
        self.keep = keep
        self.who = who
        self.stream: io.RawIOBase | None = None
        self._next_check = time.monotonic() + REOPEN_CHECK_S
        self._opened: tuple[int, int] | None = None
        self.dropped = 0  # lines this handler could not write
        self._failing = False  # the last write failed, and stderr has been told
        self._rotate_again_at = 0.0  # a rotation failed: not tried again before then (monotonic)
        self._rotation_told = False  # that failure has been said on stderr
        # Opened here, where a file that cannot be opened (a directory in its place, a file
        # another user made) is said as a full disk is, not raised out of a worker's start.
        self._open_stream()

    def _open_stream(self) -> bool:
        """Open the path for appending; False (said once, as a failed write) where it cannot be."""
        try:
            self.stream = self._open()
            self._opened = self._stream_ident()
        except OSError as exc:
            self.stream = None
            self._cannot_write(exc)
            return False
        return True

    def _open(self) -> io.FileIO:
        """The file, for appending, unbuffered; a symbolic link in its place is not followed: in
        a log folder another user may write, their link would have this process append to any
        file of its user's."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.baseFilename, flags, 0o666)
        try:
            return io.FileIO(fd, "a")
        except BaseException:
            os.close(fd)
            raise

    def _stream_ident(self) -> tuple[int, int] | None:
        return None if self.stream is None else file_ident(os.fstat(self.stream.fileno()))

    def emit(self, record: logging.LogRecord) -> None:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + REOPEN_CHECK_S
            try:
                self._follow_rotation()
            except OSError:  # a full or vanished disk: the write below reports it
                pass
        if self.stream is None and not self._open_stream():  # tried again at every line
            self.dropped += 1
            return
        try:
            line = (self.format(record) + self.terminator).encode("utf-8", "backslashreplace")
        except Exception:  # a record that cannot be formatted is the caller's bug: logging says it
            self.handleError(record)
            return
        if self.max_bytes is not None and not self._make_room(len(line), now):
            self.dropped += 1  # rotated, and the new file cannot be opened: said as a failed write
            return
        try:
            self._append(line)
        except OSError as exc:
            self.dropped += 1
            self._cannot_write(exc)
            return
        self._failing = False  # written again: a later failure is told again

    def _make_room(self, size: int, now: float) -> bool:
        """Rotate the file first where ``size`` more bytes would take it past ``max_bytes`` (see
        the module); False where the file rotated and the new one cannot be opened."""
        assert self.stream is not None and self.max_bytes is not None, "only while open, with a size"
        try:
            end = os.lseek(self.stream.fileno(), 0, os.SEEK_END)
        except OSError:  # the write that follows says what is wrong
            return True
        if end == 0 or end + size <= self.max_bytes or now < self._rotate_again_at:
            return True
        path = Path(self.baseFilename)
        try:
            with rotation_lock(path):
                # Looked at again under the lock: another writer may have rotated it already.
                still_over = os.fstat(self.stream.fileno()).st_size + size > self.max_bytes
                if still_over and self._path_names_stream():
                    rotate(path, self.keep)
            self._rotation_told = False
            return self._follow_rotation()
        except OSError as exc:
            if self.stream is None:  # the old file's close failed: the path opened instead, or said
                return self._open_stream()
            self._rotate_again_at = now + REOPEN_CHECK_S
            self._cannot_rotate(exc)
            return True  # written where it is: the file grows past its size rather than lose it

    def _path_names_stream(self) -> bool:
        try:
            return file_ident(os.stat(self.baseFilename)) == self._opened
        except FileNotFoundError:
            return False

    def _append(self, line: bytes) -> None:
        """Write ``line`` whole, or nothing of it.

        Raises:
            OSError: it could not be written (what was written of it is taken back).
        """
        assert self.stream is not None, "written only while open"
        written = self.stream.write(line)
        if written is None or written >= len(line):
            return
        self._take_back(self.stream, written)
        # The kernel gives no reason for a short write; on a regular file it is the disk (or a quota) full.
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    @staticmethod
    def _take_back(stream: io.RawIOBase, written: int) -> None:
        """Cut off the ``written`` bytes of a line the disk took only part of, if they are still
        the file's last: with O_APPEND the descriptor's offset is the end of that write."""
        try:
            fd = stream.fileno()
            end = os.lseek(fd, 0, os.SEEK_CUR)
            if os.fstat(fd).st_size == end:
                os.ftruncate(fd, end - written)
        except OSError:  # the file gone or unwritable: nothing more to do about that line
            pass

    def handleError(self, record: logging.LogRecord) -> None:
        """A line that cannot be written is dropped and counted; stderr hears of it once."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)
            return
        self.dropped += 1
        self._cannot_write(exc)

    def close(self) -> None:
        """Close the file (idempotent); a failure is said as a failed write is, not raised (it
        raised out of a run's last log line, its logging handed back, as a traceback)."""
        self.acquire()
        stream, self.stream = self.stream, None
        try:
            if stream is not None:
                stream.close()
        except OSError as exc:
            self._cannot_write(exc)
        finally:
            self.release()
            super().close()

    def _cannot_write(self, exc: OSError) -> None:
        if self._failing:
            return
        self._failing = True
        who = "" if self.who is None else f" ({self.who})"
        try:
            sys.stderr.write(
                f"troupe: cannot write the log file {self.baseFilename} ({_reason(exc)}); "
                f"its lines are dropped until it can be written{who}\n"
            )
        except (OSError, ValueError):  # stderr gone too: nothing left to tell
            pass

    def _cannot_rotate(self, exc: OSError) -> None:
        if self._rotation_told:
            return
        self._rotation_told = True
        who = "" if self.who is None else f" ({self.who})"
        where = exc.filename or self.baseFilename  # the lock file, or a rotated file, or the log
        try:
            sys.stderr.write(
                f"troupe: cannot rotate the log file {self.baseFilename} ({where}: {_reason(exc)}); "
                f"it grows past its size limit until that is mended{who}\n"
            )
        except (OSError, ValueError):  # stderr gone too: nothing left to tell
            pass

    def _follow_rotation(self) -> bool:
        """Reopen the path where it names another file than the one open; False where that
        one cannot be opened (said as a failed write).

        Raises:
            OSError: the path cannot be looked at (a full or vanished disk).
        """
        if self.stream is None or self._path_names_stream():
            return True
        # None first: a close or an open that fails leaves no closed stream for emit to
        # write to (a ValueError, which logging printed as a traceback for every line).
        stream, self.stream = self.stream, None
        stream.close()
        return self._open_stream()


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:  # O_NOFOLLOW's refusal ("too many levels of symbolic links")
        return "it is a symbolic link, which troupe does not follow: remove it"
    return str(exc.strerror or exc)
