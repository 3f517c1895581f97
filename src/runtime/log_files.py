"""A node's log files on disk: rotation by size, writers that follow it, readers that follow it.

Every process of a node appends to ``<logs>/<node>.jsonl`` (O_APPEND: one ``write`` per line,
never interleaved). Rotation is safe across those processes because exactly one process renames
and every other one only reopens:

- The node process alone rotates (:func:`rotate_if_larger`, from its log publisher's poll): it
  renames ``.jsonl`` to ``.jsonl.1`` (``.1`` to ``.2`` ..., the oldest beyond ``keep`` deleted).
  A rename never loses a line: a process that still has the old file open keeps appending to
  it, now under the name ``.1``.
- Every writer (:class:`ReopeningFileHandler`) looks at most once per :data:`REOPEN_CHECK_S`
  whether the path still names the file it has open (device and inode) and reopens the path
  when it does not; a ``stat`` per line would cost more than the line. So for up to about a
  second after a rotation some lines still land at the end of ``.1``.
- A reader (:class:`FileFollower`) that sees the path name a new file reads that one from its
  start, and keeps reading the old one for :data:`RETIRED_READ_S` as well, for those late
  lines; nothing is lost or read twice (unless a file rotates twice within one read, which at
  megabytes per rotation does not happen).
- A file cut in place instead (logrotate's ``copytruncate``, ``: > file``) is one a reader finds
  shorter than where it had read to: it reads it again from its start. Lines written between the
  copy and the cut are in the copy only (that is copytruncate's own gap), and a file that grew
  back past the old offset between two reads cannot be told from one appended to.

A single-process writer with no node (the master) rotates in its own handler instead.

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

import errno
import io
import logging
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "MAX_LINE",
    "REOPEN_CHECK_S",
    "RETIRED_READ_S",
    "FileFollower",
    "ReopeningFileHandler",
    "history_files",
    "last_lines",
    "rotate",
    "rotate_if_larger",
    "rotated_path",
]

REOPEN_CHECK_S = 1.0  # a writer notices a rotation within this long
RETIRED_READ_S = 10.0  # a reader keeps reading a rotated file this long for late lines
_READ_CHUNK = 1 << 20
MAX_LINE = 1 << 20  # a "line" that grows past this without a newline is passed on in pieces


def rotated_path(path: Path, k: int) -> Path:
    """The ``k``-th rotated file of ``path`` (``node.jsonl.k``; 1 is the newest)."""
    return path.with_name(f"{path.name}.{k}")


def rotate(path: Path, keep: int) -> None:
    """Roll ``path`` to ``path.1``, ``path.1`` to ``path.2``..., deleting what is beyond ``keep``.

    The next write by any process (re)creates ``path``. Only one process may call this for a
    given path (the node process for its node's file).

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
    """Rotate ``path`` when it holds ``max_bytes`` or more; return whether it rotated."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size < max_bytes:
        return False
    rotate(path, keep)
    return True


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
        max_bytes: with a value, this handler rotates the file itself at that size (for a
            process that is the file's only writer); None leaves rotating to the node.
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
        try:
            self._append(line)
        except OSError as exc:
            self.dropped += 1
            self._cannot_write(exc)
            return
        self._failing = False  # written again: a later failure is told again

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

    def _follow_rotation(self) -> None:
        path = Path(self.baseFilename)
        stream = self.stream
        if (
            self.max_bytes is not None
            and stream is not None
            and os.fstat(stream.fileno()).st_size >= self.max_bytes
        ):
            rotate(path, self.keep)
        try:
            current: tuple[int, int] | None = _ident(path.stat())
        except FileNotFoundError:
            current = None
        if current != self._opened and self.stream is not None:
            # None first: a close or an open that fails leaves no closed stream for emit to
            # write to (a ValueError, which logging printed as a traceback for every line).
            stream, self.stream = self.stream, None
            stream.close()
            self._open_stream()


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
    the next call; :attr:`problem` says why, and :meth:`new_problem` says it once.

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
        self._retired: list[tuple[_OpenFile, float]] = []
        self._open(at_end)

    def new_problem(self) -> str | None:
        """Why the file cannot be read, once for each spell in which it cannot: None when it can,
        or when this spell was given already."""
        if self.problem is None or self._told:
            return None
        self._told = True
        return self.problem

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
        a rotated file come before those of its successor."""
        out: list[bytes] = []
        budget = self.budget
        now = time.monotonic()
        for entry in list(self._retired):
            old, until = entry
            lines, used = self._read(old, budget)
            out.extend(lines)
            budget -= used
            if now >= until and used == 0:
                old.close()
                self._retired.remove(entry)
        if self._current is not None:
            lines, used = self._read(self._current, budget)
            out.extend(lines)
            budget -= used
        if budget > 0 and self._moved():
            if self._current is not None:
                self._retired.append((self._current, now + RETIRED_READ_S))
            self._open(at_end=False)
            if self._current is not None:
                lines, used = self._read(self._current, budget)
                out.extend(lines)
                budget -= used
        self.behind = budget <= 0
        return out

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
