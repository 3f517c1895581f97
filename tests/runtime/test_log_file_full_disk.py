"""A log file that cannot be written (a full disk) costs its lines, not the terminal."""

from __future__ import annotations

import errno
import io
import logging
from pathlib import Path

import pytest

from troupe.runtime.log_files import ReopeningFileHandler


class _Disk(io.BytesIO):
    """A stream whose writes fail with ENOSPC while ``full``."""

    full = True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord("t", logging.INFO, __file__, 1, "%s", (text,), None)


def test_a_full_disk_is_told_once_per_spell_and_the_lines_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handler = ReopeningFileHandler(tmp_path / "n.jsonl")
    disk = _Disk()
    real, handler.stream = handler.stream, disk
    try:
        for n in range(3):
            handler.emit(_record(f"lost {n}"))
        said = capsys.readouterr().err
        assert said.count("\n") == 1, said  # one line, no traceback per record
        assert f"cannot write the log file {tmp_path / 'n.jsonl'} (No space left on device)" in said
        assert handler.dropped == 3

        disk.full = False  # space again: lines are written, and a new spell is told again
        handler.emit(_record("back"))
        assert disk.getvalue() == b"back\n" and capsys.readouterr().err == ""
        disk.full = True
        handler.emit(_record("lost again"))
        assert capsys.readouterr().err.count("cannot write the log file") == 1
        assert handler.dropped == 4
    finally:
        handler.stream = real
        handler.close()


def test_an_error_that_is_not_the_disk_still_reaches_logging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record that cannot be formatted is a bug in the caller: logging's own report stays."""
    handler = ReopeningFileHandler(tmp_path / "n.jsonl")
    try:
        handler.emit(logging.LogRecord("t", logging.INFO, __file__, 1, "%d", ("not a number",), None))
    finally:
        handler.close()
    assert "--- Logging error ---" in capsys.readouterr().err
    assert handler.dropped == 0


def test_a_full_disk_found_as_the_file_is_closed_is_told_not_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Closing the run's file as a run ends (its logging handed back) raised ENOSPC out of the
    run's error as a traceback of sixty lines; every line was told again, once per line."""
    handler = ReopeningFileHandler(tmp_path / "n.jsonl")
    real, handler.stream = handler.stream, _Disk()
    assert real is not None
    real.close()
    for n in range(3):
        handler.emit(_record(f"lost {n}"))
    handler.flush()
    handler.close()  # no OSError
    handler.close()
    said = capsys.readouterr().err
    assert said.count("cannot write the log file") == 1, said
    assert handler.dropped == 3


def test_the_process_that_cannot_write_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every process of a node writes its file: each says it (a worker alone logging lost six
    thousand lines and nobody said so), naming itself."""
    handler = ReopeningFileHandler(tmp_path / "n.jsonl", who="process w1")
    real, handler.stream = handler.stream, _Disk()
    try:
        handler.emit(_record("lost"))
    finally:
        handler.stream = real
        handler.close()
    said = capsys.readouterr().err
    assert said.endswith("its lines are dropped until it can be written (process w1)\n"), said
    assert handler.dropped == 1
