"""A node's log files on disk: rotation by size, writers that follow it, readers that follow it.

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
- A reader (:class:`FileFollower`) that sees the path name a new file reads first the files
  rotated since the one it had (``.1``, ``.2`` ... by device and inode, back to that one: at a
  small size a burst rotates many times between two reads), each from its start, then the new
  one; it keeps reading the old ones for :data:`RETIRED_READ_S` as well (the newest
  :data:`MAX_RETIRED` of them: a late line misses it only if that many rotations come within a
  writer's look), for those late lines. Nothing is lost or read twice, unless the file it had
  was deleted beyond ``keep`` before it read on: then the files rotated meanwhile that are still
  there are read, and :meth:`FileFollower.new_gap` says lines may be missing, as it says of a
  rotated file it cannot open.
- A file cut in place instead (logrotate's ``copytruncate``, ``: > file``) is one a reader finds
  shorter than where it had read to: it reads it again from its start. Lines written between the
  copy and the cut are in the copy only (that is copytruncate's own gap), and a file that grew
  back past the old offset between two reads cannot be told from one appended to.

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
(:attr:`FileFollower.problem`): a node's log stream and ``troupe logs tail`` say so once and
follow on (a directory in its place ended both).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import logging
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = [
    "MAX_LINE",
    "MAX_RETIRED",
    "REOPEN_CHECK_S",
    "RETIRED_READ_S",
    "FileFollower",
    "ReopeningFileHandler",
    "history_files",
    "last_lines",
    "lock_path",
    "rotate",
    "rotate_if_larger",
    "rotated_path",
    "rotation_lock",
]

REOPEN_CHECK_S = 1.0  # a writer notices a rotation within this long
RETIRED_READ_S = 10.0  # a reader keeps reading a rotated file this long for late lines
# Rotated files a reader keeps open for late lines at most (the newest; an older one is closed once
# read to its end): at a small size a burst rotates many times within RETIRED_READ_S, and a node's
# log stream would hold a descriptor for each.
MAX_RETIRED = 64
_READ_CHUNK = 1 << 20
MAX_LINE = 1 << 20  # a "line" that grows past this without a newline is passed on in pieces


def rotated_path(path: Path, k: int) -> Path:
    """The ``k``-th rotated file of ``path`` (``node.jsonl.k``; 1 is the newest)."""
    return path.with_name(f"{path.name}.{k}")


def lock_path(path: Path) -> Path:
    """The file whose ``flock`` every process takes to rotate ``path`` (``node.jsonl.lock``)."""
    return path.with_name(f"{path.name}.lock")


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
    rotated_path(path, keep).unlink(missing_ok=True)
    for k in range(keep - 1, 0, -1):
        older = rotated_path(path, k)
        if older.exists():
            os.replace(older, rotated_path(path, k + 1))
    os.replace(path, rotated_path(path, 1))


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


def _ident(st: os.stat_result) -> tuple[int, int]:
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
        return None if self.stream is None else _ident(os.fstat(self.stream.fileno()))

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
            return _ident(os.stat(self.baseFilename)) == self._opened
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


class _OpenFile:
    """One file being read: its descriptor, identity and a partly written last line.

    Raises:
        OSError: ``path`` cannot be opened, or is not a regular file (a directory in its place).
    """

    def __init__(self, path: Path, at_end: bool) -> None:
        # O_NONBLOCK: a FIFO in the file's place does not hang the reader in open().
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(self.fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "it is a directory, not a file", str(path))
            raise OSError(errno.EINVAL, "it is not a regular file", str(path))
        self.ident = _ident(st)
        if at_end:
            os.lseek(self.fd, 0, os.SEEK_END)
        self.partial = b""

    def read(self, budget: int) -> tuple[list[bytes], int]:
        """Complete lines read within ``budget`` bytes, and the bytes read."""
        if os.fstat(self.fd).st_size < os.lseek(self.fd, 0, os.SEEK_CUR):
            # Cut in place (logrotate's copytruncate, ``: > file``): what it holds now was written
            # since, from its start. Read on from the old offset, the lines up to it were lost and
            # the first thing read was the tail of a line. The torn line before the cut is never
            # completed: dropped, not joined to the first new one.
            os.lseek(self.fd, 0, os.SEEK_SET)
            self.partial = b""
        lines: list[bytes] = []
        used = 0
        while used < budget:
            chunk = os.read(self.fd, min(_READ_CHUNK, budget - used))
            if not chunk:
                break
            used += len(chunk)
            *done, self.partial = (self.partial + chunk).split(b"\n")
            lines.extend(done)
            if len(self.partial) > MAX_LINE:  # memory stays bounded whatever a writer does
                lines.append(self.partial)
                self.partial = b""
        return lines, used

    def close(self) -> None:
        os.close(self.fd)


class FileFollower:
    """The complete lines appended to a log file, across its rotations (see the module).

    A file that cannot be read (a directory in its place, its permissions, a disk error) costs
    its lines, not the reader: :meth:`read_lines` returns what it could read, and tries again at
    the next call; :attr:`problem` says why, and :meth:`new_problem` says it once. Rotated files
    it could not read at all (see the module) are said once by :meth:`new_gap`.

    Args:
        path: the file; it may not exist yet.
        at_end: start at the current end (only new lines), else at the start of the file.
        budget: bytes read per :meth:`read_lines` call at most, so that a burst is taken in
            parts; :attr:`behind` says that more is waiting.
    """

    def __init__(self, path: Path, at_end: bool = False, budget: int = 8 << 20) -> None:
        self.path = path
        self.budget = budget
        self.behind = False
        self.problem: str | None = None  # why the file cannot be read now; None while it can
        self._told = False  # new_problem gave the current problem
        self._current: _OpenFile | None = None
        self._retired: list[tuple[_OpenFile, float]] = []  # oldest first
        self._unopened: list[tuple[int, str]] = []  # rotated files not read (bytes, why), for new_gap
        self._lost_past_keep = False  # for new_gap
        self._open(at_end)

    def new_problem(self) -> str | None:
        """Why the file cannot be read, once for each spell in which it cannot: None when it can,
        or when this spell was given already."""
        if self.problem is None or self._told:
            return None
        self._told = True
        return self.problem

    def new_gap(self) -> str | None:
        """What this follower skipped since the last call, in one line: rotated files it could
        not open, and lines that may be missing where a file rotated past ``log_keep`` before it
        was read; None where it skipped nothing."""
        said: list[str] = []
        if self._unopened:
            count = len(self._unopened)
            size = sum(size for size, _ in self._unopened)
            files = "file" if count == 1 else "files"
            bytes_ = f"{size} bytes; " if size else ""
            said.append(
                f"could not read {count} rotated {files} of the log file {self.path} "
                f"({bytes_}{self._unopened[-1][1]}): their lines were skipped"
            )
        if self._lost_past_keep:
            said.append(
                f"lines of the log file {self.path} may be missing: it rotated past log_keep before "
                "they were read (a larger log_keep or log_max_mb keeps them)"
            )
        self._unopened, self._lost_past_keep = [], False
        return "; ".join(said) or None

    def _failed(self, exc: OSError) -> None:
        self.problem = f"cannot read the log file {self.path} ({exc.strerror or exc})"

    def _read(self, source: _OpenFile, budget: int) -> tuple[list[bytes], int]:
        try:
            read = source.read(budget)
        except OSError as exc:  # an I/O error: kept open, and read again from there next time
            self._failed(exc)
            return [], 0
        if source is self._current:  # a rotated file read says nothing of the path's
            self.problem, self._told = None, False
        return read

    def _open(self, at_end: bool) -> None:
        self._current = None
        try:
            self._current = _OpenFile(self.path, at_end)
        except FileNotFoundError:  # not made yet, or rotated away: not a problem
            pass
        except OSError as exc:  # tried again at the next read
            self._failed(exc)

    def read_lines(self) -> list[bytes]:
        """The complete lines written since the last call (without their newlines); lines of
        a rotated file come before those of its successors."""
        out: list[bytes] = []
        now = time.monotonic()
        budget = self._read_retired(out, self.budget, now)
        if self._current is not None:
            budget = self._read_current(out, budget)
        if budget > 0 and self._moved():
            self._follow(now)
            budget = self._read_retired(out, budget, now)
            if self._current is not None:
                budget = self._read_current(out, budget)
        self.behind = budget <= 0
        return out

    def _read_current(self, out: list[bytes], budget: int) -> int:
        assert self._current is not None, "only with a file open"
        lines, used = self._read(self._current, budget)
        out.extend(lines)
        return budget - used

    def _read_retired(self, out: list[bytes], budget: int, now: float) -> int:
        """Read the rotated files still open, oldest first; close those read to their end whose
        time is up, or that are older than the newest :data:`MAX_RETIRED`."""
        for entry in list(self._retired):
            old, until = entry
            lines, used = self._read(old, budget)
            out.extend(lines)
            # used == 0 says the end only where there was budget to read on with.
            at_end = used == 0 and budget > 0
            budget -= used
            too_many = len(self._retired) > MAX_RETIRED
            if at_end and (now >= until or too_many):
                old.close()
                self._retired.remove(entry)
        return budget

    def _follow(self, now: float) -> None:
        """The path names another file: read on from the one held into the files rotated since
        (they are retired, to be read first), then the new one."""
        held = self._current
        if held is None:
            self._open(at_end=False)
            return
        try:
            new = _OpenFile(self.path, at_end=False)
        except FileNotFoundError:  # rotated away again before it was made anew: the next read
            return  # finds the new one, and this one among the rotated files
        except OSError as exc:  # a directory in its place, say: tried again at the next read
            self._retired.append((held, now + RETIRED_READ_S))
            self._current = None
            self._failed(exc)
            return
        for source in [held, *self._rotated_between(held, new)]:
            self._retired.append((source, now + RETIRED_READ_S))
        self._current = new

    def _rotated_between(self, held: _OpenFile, new: _OpenFile) -> list[_OpenFile]:
        """The rotated files newer than ``held`` and older than ``new``, oldest first, opened.

        Looked for newest first (``.1``, ``.2`` ...) back to ``held``: a rotation meanwhile
        moves every file one name up, so each is met at least once (a second time is known by
        its inode), and a name missing for a moment (a rotation midway) is stepped over while
        a higher one exists. Where ``new`` itself was rotated meanwhile, the files met before it
        are newer than it: they are left to the next read.
        """
        found: list[tuple[os.stat_result, _OpenFile | None, str]] = []
        seen: set[tuple[int, int]] = set()
        reached = False
        k = 0
        while not reached:
            k += 1
            st, opened, why = _look(rotated_path(self.path, k))
            if st is None:
                if _highest_rotated(self.path) > k:
                    continue
                break
            ident = _ident(st)
            if ident == new.ident:  # rotated since it was opened: those met so far are newer
                for _, newer, _ in [*found, (st, opened, why)]:
                    if newer is not None:
                        newer.close()
                found = []  # (the next read finds them after it)
                continue
            reached = ident == held.ident
            if reached or ident in seen:
                if opened is not None:
                    opened.close()
                continue
            seen.add(ident)
            found.append((st, opened, why))
        if not reached:
            found = self._newer_than_lost(held, found)
        between: list[_OpenFile] = []
        for st, opened, why in reversed(found):
            if opened is None:
                self._unopened.append((st.st_size if stat.S_ISREG(st.st_mode) else 0, why))
            else:
                between.append(opened)
        return between

    def _newer_than_lost(
        self, held: _OpenFile, found: list[tuple[os.stat_result, _OpenFile | None, str]]
    ) -> list[tuple[os.stat_result, _OpenFile | None, str]]:
        """Of the rotated files ``found`` where ``held`` is not among them, those rotated after it.

        Deleted (rotated past ``keep``): every file there was renamed by the rotation that
        deleted it, or later (their ``ctime`` is not older than its), and some between may
        have gone too; deleted by hand, the rotated files there are older, read already. Still
        linked under another name (another tool's rotation, ``dateext``, say): the rotated files
        are older than it.
        """
        try:
            gone = os.fstat(held.fd)
        except OSError:
            gone = None
        newer = []
        for entry in found:
            st, opened, _ = entry
            if gone is not None and gone.st_nlink == 0 and st.st_ctime_ns >= gone.st_ctime_ns:
                newer.append(entry)
            elif opened is not None:
                opened.close()
        if newer:
            self._lost_past_keep = True
        return newer

    def _moved(self) -> bool:
        try:
            ident = _ident(self.path.stat())
        except FileNotFoundError:
            return False
        except OSError as exc:  # its directory unreadable, say: the next read tries again
            self._failed(exc)
            return False
        return self._current is None or ident != self._current.ident

    def close(self) -> None:
        """Close every file this follower reads."""
        for old, _ in self._retired:
            old.close()
        self._retired.clear()
        if self._current is not None:
            self._current.close()
            self._current = None


def _look(name: Path) -> tuple[os.stat_result | None, _OpenFile | None, str]:
    """A rotated file opened to be read, with its status; or its status and why it cannot be read
    (said by ``new_gap`` where it was one to read); or no status, where there is none to look at."""
    try:
        opened = _OpenFile(name, at_end=False)
    except FileNotFoundError:
        return None, None, ""
    except OSError as exc:  # a directory, say, or too many files open
        try:
            return name.stat(), None, f"{name.name}: {exc.strerror or exc}"
        except OSError:
            return None, None, ""
    try:
        return os.fstat(opened.fd), opened, ""
    except OSError:
        opened.close()
        return None, None, ""


def _highest_rotated(path: Path) -> int:
    """The highest ``k`` of ``path``'s rotated files (``path.k``) there now; 0 where none is."""
    return max((int(p.name.rsplit(".", 1)[1]) for p in history_files(path) if p != path), default=0)
