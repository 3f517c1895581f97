"""A log file path that is a directory (or cannot be opened) costs that file's lines, not the process
that writes or reads it: said once in one line, and the lines flow again once the path is a file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import structlog

import troupe.runtime.log_files as log_files
from troupe.runtime.log_files import ReopeningFileHandler, last_lines
from troupe.runtime.log_follower import FileFollower
from troupe.runtime.log_publisher import LogPublisher


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord("t", logging.INFO, __file__, 1, "%s", (text,), None)


def test_a_follower_of_a_directory_says_why_once_and_reads_the_file_made_there_later(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.mkdir()
    follower = FileFollower(path)
    try:
        assert follower.read_lines() == []  # it raised IsADirectoryError
        problem = follower.new_problem()
        assert problem is not None and f"cannot read the log file {path} (" in problem
        assert follower.read_lines() == [] and follower.new_problem() is None  # said once
        path.rmdir()
        path.write_bytes(b"one\ntwo\n")
        assert follower.read_lines() == [b"one", b"two"]
        assert follower.problem is None
    finally:
        follower.close()


def test_a_followed_file_replaced_by_a_directory_is_read_to_its_end_and_the_reader_goes_on(
    tmp_path: Path,
) -> None:
    path = tmp_path / "n1.jsonl"
    path.write_bytes(b"a\n")
    follower = FileFollower(path)
    try:
        assert follower.read_lines() == [b"a"]
        with path.open("ab") as old:
            path.unlink()
            path.mkdir()
            old.write(b"b\n")  # a late line in the file the path named before
            old.flush()
            assert follower.read_lines() == [b"b"]
        assert follower.new_problem() is not None
        assert follower.read_lines() == [] and follower.new_problem() is None
    finally:
        follower.close()
    assert last_lines([path], 5) == []  # history skips it too


def test_a_writer_whose_file_is_a_directory_drops_its_lines_and_says_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "n.jsonl"
    path.mkdir()
    handler = ReopeningFileHandler(path)  # it raised IsADirectoryError out of a worker's start
    try:
        handler.emit(_record("lost 1"))
        handler.emit(_record("lost 2"))
        said = capsys.readouterr().err
        assert said.count("\n") == 1, said
        assert f"troupe: cannot write the log file {path} (Is a directory); its lines are dropped" in said
        assert handler.dropped == 2
        path.rmdir()
        handler.emit(_record("back"))
        assert path.read_text() == "back\n" and capsys.readouterr().err == ""
    finally:
        handler.close()


def test_a_writer_does_not_follow_a_symbolic_link_in_its_file_s_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a log folder another user may write, their link to a file of ours had every line
    appended to that file (report sh 6): the link is refused in one line and the file untouched."""
    victim = tmp_path / "private.txt"
    victim.write_text("PRIVATE\n")
    path = tmp_path / "n.jsonl"
    path.symlink_to(victim)
    handler = ReopeningFileHandler(path)
    try:
        handler.emit(_record("lost"))
        said = capsys.readouterr().err
        assert said == (
            f"troupe: cannot write the log file {path} (it is a symbolic link, which troupe does not "
            "follow: remove it); its lines are dropped until it can be written\n"
        )
        assert victim.read_text() == "PRIVATE\n" and handler.dropped == 1
        path.unlink()
        handler.emit(_record("back"))
        assert path.read_text() == "back\n" and not path.is_symlink()
    finally:
        handler.close()


def test_a_written_file_replaced_by_a_directory_costs_lines_not_tracebacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rotation check found the path changed, closed its file and failed to open the directory:
    every later line was a write to a closed file, printed by logging as a traceback."""
    monkeypatch.setattr(log_files, "REOPEN_CHECK_S", 0.0)  # look before every line
    path = tmp_path / "n.jsonl"
    handler = ReopeningFileHandler(path)
    try:
        handler.emit(_record("one"))
        path.unlink()
        path.mkdir()
        handler.emit(_record("lost 1"))
        handler.emit(_record("lost 2"))
        said = capsys.readouterr().err
        assert "Logging error" not in said and "Traceback" not in said
        assert said.count("cannot write the log file") == 1 and handler.dropped == 2
        path.rmdir()
        handler.emit(_record("two"))
        assert path.read_text() == "two\n"
    finally:
        handler.close()


@pytest.mark.anyio
async def test_a_log_stream_whose_file_becomes_a_directory_warns_once_and_polls_on(tmp_path: Path) -> None:
    """The node's and the master's publisher: its poll raised, and the process exited 1."""
    path = tmp_path / "n1.jsonl"
    path.write_text("")
    pub = LogPublisher("n1", path, "tcp://127.0.0.1:*", None, 1 << 20, keep=2)
    try:
        path.unlink()
        path.mkdir()
        with structlog.testing.capture_logs() as logged:
            await pub.poll()
            await pub.poll()
        warned = [e for e in logged if e["event"] == "log_file_unreadable"]
        assert len(warned) == 1 and "cannot read the log file" in str(warned[0]["error"])
        path.rmdir()
        path.write_text('{"event": "x"}\n')
        await pub.poll()
        assert pub.published == 1
    finally:
        pub.close()
