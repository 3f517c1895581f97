"""A log file cut in place (logrotate's copytruncate, ``: > file``) is read again from its start."""

from __future__ import annotations

from pathlib import Path

from troupe.runtime.log_follower import FileFollower


def _lines(first: int, last: int) -> bytes:
    return b"".join(b'{"i": %d, "pad": "xxxxxxxxxxxxxxxx"}\n' % i for i in range(first, last))


def _cut(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(0)


def test_a_follower_reads_a_file_cut_in_place_from_its_start(tmp_path: Path) -> None:
    """After the cut, the lines written since are read whole, however few: none lost, no torn tail
    of a line (it had read on from the old offset: nothing until the file grew past it, then a
    fragment)."""
    path = tmp_path / "n1.jsonl"
    path.write_bytes(_lines(0, 10))
    follower = FileFollower(path)
    try:
        assert len(follower.read_lines()) == 10
        _cut(path)
        with path.open("ab") as f:
            f.write(_lines(10, 12))  # fewer bytes than were read before the cut
        assert follower.read_lines() == _lines(10, 12).splitlines()
        with path.open("ab") as f:
            f.write(_lines(12, 40))
        assert follower.read_lines() == _lines(12, 40).splitlines()
    finally:
        follower.close()


def test_a_torn_line_before_the_cut_is_not_joined_to_the_next(tmp_path: Path) -> None:
    """A partial last line when the file is cut is never completed: it is dropped, and the first line
    written after the cut comes out as it was written."""
    path = tmp_path / "n1.jsonl"
    path.write_bytes(_lines(0, 3) + b'{"i": 3, "half')
    follower = FileFollower(path)
    try:
        assert len(follower.read_lines()) == 3
        _cut(path)
        with path.open("ab") as f:
            f.write(_lines(4, 5))
        assert follower.read_lines() == _lines(4, 5).splitlines()
    finally:
        follower.close()
