"""The reader that follows a node's log file across its rotations (the writers' side, and the
rotated files' names: :mod:`troupe.runtime.log_files`).

- A reader (:class:`FileFollower`) that sees the path name a new file reads first the files
  rotated since the one it had (``.1``, ``.2`` ... by device and inode, back to that one: at a
  small size a burst rotates many times between two reads), each from its start, then the new
  one; it keeps reading the old ones for :data:`RETIRED_READ_S` as well (the newest
  :data:`MAX_RETIRED` of them: a late line misses it only if that many rotations come within a
  writer's look), for those late lines. Nothing is lost or read twice, unless files went past
  ``keep`` before it read them: where the file it had was deleted, it still reads that one to its
  end (it holds it open), then the files rotated meanwhile that are still there, and
  :meth:`FileFollower.new_gap` says lines may be missing where one between those went unread, as
  it says of a rotated file it cannot open. How many files came between is the writers' count of
  rotations (:func:`~troupe.runtime.log_files.rotation_count`, read around each ``open`` of the
  path); where there is none (an older troupe rotated the file, or a rotation was under way
  at the ``open``), the files' times stand in, which cannot tell one rotation from the next: lines
  are said to be maybe missing wherever the file it had was deleted (at ``keep = 1``, two
  rotations between reads, which lose nothing), and where a late line landed in the deleted file
  after the rotation, the files between look older than it and are passed over, unsaid.
- A file cut in place instead (logrotate's ``copytruncate``, ``: > file``) is one a reader finds
  shorter than where it had read to: it reads it again from its start. Lines written between the
  copy and the cut are in the copy only (that is copytruncate's own gap), and a file that grew
  back past the old offset between two reads cannot be told from one appended to.

A file that cannot be read costs a reader that file's lines only (:attr:`FileFollower.problem`):
a node's log stream and ``troupe logs tail`` say so once and follow on (a directory in its place
ended both).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

from .log_files import file_ident, history_files, rotated_path, rotation_count

__all__ = ["MAX_LINE", "MAX_RETIRED", "RETIRED_READ_S", "FileFollower"]

RETIRED_READ_S = 10.0  # a reader keeps reading a rotated file this long for late lines
# Rotated files a reader keeps open for late lines at most (the newest; an older one is closed once
# read to its end): at a small size a burst rotates many times within RETIRED_READ_S, and a node's
# log stream would hold a descriptor for each.
MAX_RETIRED = 64
_READ_CHUNK = 1 << 20
MAX_LINE = 1 << 20  # a "line" that grows past this without a newline is passed on in pieces


class _OpenFile:
    """One file being read: its descriptor, identity and a partly written last line; and, for the
    path's file, the rotations made before it (see :func:`_open_counted`).

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
        self.ident = file_ident(st)
        if at_end:
            os.lseek(self.fd, 0, os.SEEK_END)
        self.partial = b""
        self.rotations: int | None = None  # unknown: a rotated file, or the count not had

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
            self._current = _open_counted(self.path, at_end)
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
            new = _open_counted(self.path, at_end=False)
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
            ident = file_ident(st)
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
            found = self._newer_than_lost(held, new, found)
        between: list[_OpenFile] = []
        for st, opened, why in reversed(found):
            if opened is None:
                self._unopened.append((st.st_size if stat.S_ISREG(st.st_mode) else 0, why))
            else:
                between.append(opened)
        return between

    def _newer_than_lost(
        self, held: _OpenFile, new: _OpenFile, found: list[tuple[os.stat_result, _OpenFile | None, str]]
    ) -> list[tuple[os.stat_result, _OpenFile | None, str]]:
        """Of the rotated files ``found`` where ``held`` is not among them, those rotated after it;
        lines may be missing where some rotated after it are gone too.

        Counted (the rotations before ``held`` and before ``new`` are known): the files between
        the two number one less than the rotations from one to the other, and ``found`` are all
        of them or fewer (``held`` itself rotated past ``keep``; it is read to its end, being
        open). Found more, something the count did not see (a rotation by another tool, ``held``
        deleted by hand) moved them: the files' times are looked at instead.

        By the times: deleted (rotated past ``keep``), every file there was renamed by the
        rotation that deleted it, or later (their ``ctime`` is not older than its), and some
        between may have gone too; deleted by hand, the rotated files there are older, read
        already. Still linked under another name (another tool's rotation, ``dateext``, say):
        the rotated files are older than it.
        """
        if held.rotations is not None and new.rotations is not None:
            between = new.rotations - held.rotations - 1
            if len(found) <= between:
                if len(found) < between:
                    self._lost_past_keep = True
                return found
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
            ident = file_ident(self.path.stat())
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


def _open_counted(path: Path, at_end: bool) -> _OpenFile:
    """The file ``path`` names, opened, with the rotations made before it where the writers'
    count says the same before and after the ``open`` (no rotation came between: the file opened
    is the one made after that many).

    Raises:
        OSError: as :class:`_OpenFile`.
    """
    before = rotation_count(path)
    opened = _OpenFile(path, at_end)
    if before is not None and rotation_count(path) == before:
        opened.rotations = before
    return opened


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
