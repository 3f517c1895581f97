"""A run inside a program (``run_pipeline``, ``run_training``) logs to its own file while it
runs and gives the program its logging back as it ends: the program's handlers and level, and
structlog through the standard library. The run's file kept the program's lines after the run,
and a second run's lines went into the first run's file."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from troupe.runtime.log_files import ReopeningFileHandler
from troupe.runtime.logs import program_logs_itself, run_log


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def program() -> Iterator[_Kept]:
    """A program that set up the standard library's logging only (a handler of its own)."""
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    for handler in before[0]:
        root.removeHandler(handler)
    structlog.reset_defaults()
    kept = _Kept()
    root.addHandler(kept)
    root.setLevel(logging.INFO)
    try:
        yield kept
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in before[0]:
            root.addHandler(handler)
        root.setLevel(before[1])
        structlog.reset_defaults()


def _lines(log_dir: Path) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted(log_dir.glob("*.jsonl")))


def test_each_run_logs_to_its_own_file_and_the_program_gets_its_logging_back(
    program: _Kept, tmp_path: Path
) -> None:
    for name in ("first", "second"):
        with run_log("local", "run") as held:
            assert held is not None
            structlog.get_logger("troupe.test").info("held_before_the_file", run=name)
            held.write_to(tmp_path / name)
            structlog.get_logger("troupe.test").info("in_the_run", run=name)
        root = logging.getLogger()
        assert program in root.handlers and root.level == logging.INFO
        assert not any(isinstance(h, ReopeningFileHandler) for h in root.handlers)  # the run's file
        assert not program_logs_itself()  # the next run holds its lines again
    for name, other in (("first", "second"), ("second", "first")):
        text = _lines(tmp_path / name)
        assert f'"run": "{name}"' in text and "held_before_the_file" in text and "in_the_run" in text
        assert f'"run": "{other}"' not in text
    structlog.get_logger("mine").warning("after_the_runs")
    logging.getLogger("mine").warning("stdlib_after")
    said = [r.getMessage() for r in program.records]
    assert any("after_the_runs" in m for m in said) and "stdlib_after" in said
    assert "after_the_runs" not in _lines(tmp_path / "first") + _lines(tmp_path / "second")


def test_a_run_leaves_a_program_that_set_up_structlog_alone(program: _Kept, tmp_path: Path) -> None:
    structlog.configure(processors=[structlog.processors.JSONRenderer()])
    mine = structlog.get_config()
    assert program_logs_itself()
    with run_log("local", "run") as held:
        assert held is None
    assert structlog.get_config() == mine and program in logging.getLogger().handlers
