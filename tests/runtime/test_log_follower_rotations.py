"""A log follower reads every file rotated between two of its reads, in order, each line once.

At a small ``log_max_mb`` a burst rotates the file many times within one poll: a follower that went
from the file it had straight to the path's new one skipped every file between (``troupe logs
tail`` and a node's log stream saw a quarter of a burst). The writer here is a fake that rotates
between two reads, so no test depends on timing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import troupe.runtime.log_follower as log_follower
from troupe.runtime.log_files import rotate, rotated_path
from troupe.runtime.log_follower import FileFollower


def _rotate_and_write(path: Path, names: list[bytes], keep: int = 10) -> list[bytes]:
    """Rotate ``path``, then write two lines of each name to the new file, once per name; the lines."""
    written: list[bytes] = []
    for name in names:
        rotate(path, keep=keep)
        lines = [name + b"0", name + b"1"]
        with path.open("ab") as f:
            f.write(b"".join(ln + b"\n" for ln in lines))
        written.extend(lines)
    return written


def test_every_file_rotated_between_two_reads_is_read_in_order_once(tmp_path: Path) -> None:
    """The file it had is read on (a late writer's lines in it too), then each file rotated since,
    oldest first, from its start, then the path's new file."""
    path = tmp_path / "n.jsonl"
    late = path.open("ab", buffering=0)  # a writer that has not reopened yet
    follower = FileFollower(path)
    try:
        late.write(b"a0\n")
        assert follower.read_lines() == [b"a0"]
        late.write(b"a1\n")
        written = _rotate_and_write(path, [b"b", b"c", b"d", b"e"])
        late.write(b"a2\n")  # lands in n.jsonl.4, the file the follower had
        assert follower.read_lines() == [b"a1", b"a2", *written]
        more = _rotate_and_write(path, [b"f", b"g"])
        assert follower.read_lines() == more
        assert follower.read_lines() == []
        assert follower.new_gap() is None
    finally:
        follower.close()
        late.close()


def test_a_burst_larger_than_a_read_is_taken_in_parts_in_order(tmp_path: Path) -> None:
    """With a budget smaller than what rotated, each read goes on where the last stopped."""
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"")
    follower = FileFollower(path, budget=7)
    try:
        written = _rotate_and_write(path, [b"b", b"c", b"d"])
        got: list[bytes] = []
        for _ in range(20):  # 18 bytes a file, 7 a read: bounded
            got.extend(follower.read_lines())
            if not follower.behind and got == written:
                break
        assert got == written
    finally:
        follower.close()


def test_a_file_rotated_past_keep_before_it_was_read_is_said_in_one_line(tmp_path: Path) -> None:
    """The files still there are read; that lines may be missing is said once, naming log_keep."""
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"a0\n")
    follower = FileFollower(path)
    try:
        assert follower.read_lines() == [b"a0"]
        written = _rotate_and_write(path, [b"b", b"c", b"d", b"e"], keep=2)  # a and b deleted
        assert follower.read_lines() == written[2:]
        gap = follower.new_gap()
        assert gap is not None and "\n" not in gap
        assert f"lines of the log file {path} may be missing" in gap and "log_keep" in gap
        assert follower.new_gap() is None  # said once
        assert follower.read_lines() == []
        assert _rotate_and_write(path, [b"f"], keep=2) == [b"f0", b"f1"]
        assert follower.read_lines() == [b"f0", b"f1"]
        assert follower.new_gap() is None
    finally:
        follower.close()


def test_at_keep_1_two_rotations_between_reads_lose_nothing_and_say_nothing(tmp_path: Path) -> None:
    """The file it had is deleted by the second rotation, but it holds it open and reads it to its
    end; the one file between is ``.1``: every line is read, and no note says lines may be missing.
    By the files' times it said they may be, and skipped ``.1`` unsaid where a late line made the
    deleted file look newer than it."""
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"a0\n")
    follower = FileFollower(path)
    try:
        assert follower.read_lines() == [b"a0"]
        with path.open("ab", buffering=0) as late:  # a writer that has not reopened yet
            late.write(b"a1\n")
            written = _rotate_and_write(path, [b"b", b"c"], keep=1)  # a deleted
            late.write(b"a2\n")  # lands in the deleted file, which the follower still reads
        assert follower.read_lines() == [b"a1", b"a2", *written]
        assert follower.new_gap() is None
        more = _rotate_and_write(path, [b"d", b"e"], keep=1)  # c, the file it has now, deleted
        assert follower.read_lines() == more
        assert follower.new_gap() is None
    finally:
        follower.close()


def test_at_keep_1_three_rotations_between_reads_lose_a_file_and_say_so(tmp_path: Path) -> None:
    """The file between the one it had and ``.1`` went past keep unread: the note says so."""
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"a0\n")
    follower = FileFollower(path)
    try:
        assert follower.read_lines() == [b"a0"]
        written = _rotate_and_write(path, [b"b", b"c", b"d"], keep=1)  # a and b deleted
        assert follower.read_lines() == written[2:]
        gap = follower.new_gap()
        assert gap is not None and f"lines of the log file {path} may be missing" in gap
        assert follower.new_gap() is None
    finally:
        follower.close()


def test_a_log_rotated_with_no_count_is_judged_by_the_files_times(tmp_path: Path) -> None:
    """An older troupe rotates without counting: the follower cannot tell how many files came
    between, and says lines may be missing wherever the file it had was deleted, at keep 1 after
    two rotations too."""
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"a0\n")
    follower = FileFollower(path)
    try:
        assert follower.read_lines() == [b"a0"]
        for name in [b"b", b"c"]:  # rotated as an older troupe did, at keep 1
            os.replace(path, rotated_path(path, 1))
            path.write_bytes(name + b"0\n")
        assert follower.read_lines() == [b"b0", b"c0"]
        gap = follower.new_gap()
        assert gap is not None and "may be missing" in gap
    finally:
        follower.close()


def test_a_rotated_file_it_cannot_read_is_counted_and_said(tmp_path: Path) -> None:
    """A directory among the rotated files (the path was one for a while) costs that one only."""
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"a0\n")
    follower = FileFollower(path)
    try:
        assert follower.read_lines() == [b"a0"]
        rotate(path, keep=10)
        path.mkdir()
        written = _rotate_and_write(path, [b"b", b"c"])  # the directory is n.jsonl.2 now
        assert follower.read_lines() == written
        gap = follower.new_gap()
        assert gap is not None and "\n" not in gap
        assert gap.startswith(f"could not read 1 rotated file of the log file {path}")
        assert "(n.jsonl.2: it is a directory, not a file)" in gap
        assert follower.new_gap() is None
    finally:
        follower.close()


def test_files_rotated_after_the_new_one_was_opened_are_left_to_the_next_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path rotates twice more between the follower's open of its new file and its look at the
    rotated ones: the file newer than the new one is read after it, at the next read, once."""
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"a0\n")
    armed = [False]

    class RotatingOnOpen(log_follower._OpenFile):
        def __init__(self, opened: Path, at_end: bool) -> None:
            super().__init__(opened, at_end)
            if armed[0] and opened == path:
                armed[0] = False
                _rotate_and_write(path, [b"y", b"z"])

    monkeypatch.setattr(log_follower, "_OpenFile", RotatingOnOpen)
    follower = FileFollower(path)
    try:
        assert follower.read_lines() == [b"a0"]
        written = _rotate_and_write(path, [b"b", b"x"])
        armed[0] = True
        assert follower.read_lines() == written  # up to x, the file it opened
        assert follower.read_lines() == [b"y0", b"y1", b"z0", b"z1"]
        assert follower.read_lines() == []
    finally:
        follower.close()


def _open_under(folder: Path) -> int:
    """How many descriptors of this process name a file under ``folder`` (rotated ones included)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing
            continue
        count += target.startswith(str(folder))
    return count


def test_the_rotated_files_it_keeps_open_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_RETIRED, the older rotated files are closed once read to their end; the newest ones
    are still read for late lines."""
    monkeypatch.setattr(log_follower, "MAX_RETIRED", 2)
    path = tmp_path / "n.jsonl"
    path.write_bytes(b"")
    follower = FileFollower(path)
    try:
        written = _rotate_and_write(path, [b"b", b"c", b"d", b"e", b"f", b"g"])
        assert follower.read_lines() == written
        assert follower.read_lines() == []  # each found at its end, the older ones are closed
        assert _open_under(tmp_path) == 2 + 1  # the two newest rotated files and the path's
        with rotated_path(path, 1).open("ab") as late:  # f's file: still read
            late.write(b"f2\n")
        assert follower.read_lines() == [b"f2"]
    finally:
        follower.close()
    assert _open_under(tmp_path) == 0
