"""A run logs to its own file while it runs (``run_log``), and the file takes nothing after it.

In a program's process (``run_pipeline`` from a user's program) the program's logging is left
as it set it up, for the whole run: its root handlers stay, get its own lines and troupe's at its
levels, and its own lines never go into the run's file, which takes troupe's lines at info
whatever the program's levels (ap 2: the run set the program's handlers aside, and its lines,
stamped ``process: run``, went into the file; where it had configured structlog, the run's lines
were missing from the file instead). In a process troupe owns (``troupe run``) the run configures
the process's logging, and gives it back as it ends. A run's file kept the lines after the run,
and a second run's lines went into the first run's file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from troupe.runtime.library_logging import get_logger, own_this_process
from troupe.runtime.log_files import ReopeningFileHandler
from troupe.runtime.logs import run_log

TROUPE_LINE = get_logger("troupe.runtime.test_run_log")  # what a module of troupe logs with


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def said(self) -> list[str]:
        return [r.getMessage() for r in self.records]


def _kept_on_root(level: int) -> Iterator[_Kept]:
    """A handler of the program's own on the root logger (``logging.basicConfig``'s, say)."""
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    for handler in before[0]:
        root.removeHandler(handler)
    kept = _Kept()
    root.addHandler(kept)
    root.setLevel(level)
    try:
        yield kept
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in before[0]:
            root.addHandler(handler)
        root.setLevel(before[1])


@pytest.fixture
def program() -> Iterator[_Kept]:
    """A program's process that set up the standard library's logging (info and above)."""
    own_this_process(False)
    yield from _kept_on_root(logging.INFO)


@pytest.fixture
def command() -> Iterator[_Kept]:
    """A process troupe owns (``troupe run``'s), with a handler on its root logger."""
    yield from _kept_on_root(logging.INFO)
    structlog.reset_defaults()


def _lines(log_dir: Path) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted(log_dir.glob("*.jsonl")))


def _events(log_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in _lines(log_dir).splitlines()]


def test_a_programs_handlers_stay_through_the_run_and_its_lines_stay_out_of_the_file(
    program: _Kept, tmp_path: Path
) -> None:
    mine = logging.getLogger("myapp")
    root = logging.getLogger()
    handlers = list(root.handlers)  # the program's, and pytest's capture
    for name in ("first", "second"):
        with run_log("local", "run") as held:
            assert held is not None
            TROUPE_LINE.info("held_before_the_file", run=name)
            mine.warning("mine_before_the_file %s", name)
            held.write_to(tmp_path / name)
            TROUPE_LINE.warning("in_the_run", run=name)
            mine.warning("mine_in_the_run %s", name)
            assert root.handlers == handlers and root.level == logging.INFO
        assert not any(isinstance(h, ReopeningFileHandler) for h in logging.getLogger("troupe").handlers)
        TROUPE_LINE.warning("after_the_run", run=name)
    for name in ("first", "second"):
        events = _events(tmp_path / name)
        assert [e["event"] for e in events] == ["held_before_the_file", "in_the_run"]
        assert all(e["run"] == name and e["process"] == "run" and e["node"] == "local" for e in events)
    said = program.said()
    for name in ("first", "second"):  # the program's own lines, and troupe's, reached its handler
        assert f"mine_before_the_file {name}" in said and f"mine_in_the_run {name}" in said
        assert sum(f'"run": "{name}"' in m for m in said) == 3  # held, in the run, after it
    assert structlog.is_configured() is False  # troupe configured no structlog of the program's


def test_the_file_takes_troupes_info_lines_the_program_does_not_want(program: _Kept, tmp_path: Path) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    with run_log("local", "run") as held:
        assert held is not None
        held.write_to(tmp_path)
        TROUPE_LINE.info("an_info_line")
        TROUPE_LINE.debug("a_debug_line")
        TROUPE_LINE.warning("a_warning")
    assert [e["event"] for e in _events(tmp_path)] == ["an_info_line", "a_warning"]
    assert [json.loads(m)["event"] for m in program.said()] == ["a_warning"]


def test_a_program_that_configured_structlog_keeps_it_and_the_run_its_lines(
    program: _Kept, tmp_path: Path
) -> None:
    structlog.configure(processors=[structlog.processors.JSONRenderer()])
    mine = structlog.get_config()
    with run_log("local", "run") as held:
        assert held is not None
        held.write_to(tmp_path)
        TROUPE_LINE.warning("in_the_run")
    assert structlog.get_config() == mine
    assert [e["event"] for e in _events(tmp_path)] == ["in_the_run"]


def test_a_run_keeps_troupes_warnings_off_the_terminal_of_a_program_without_logging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    own_this_process(False)
    root = logging.getLogger()
    handlers = list(root.handlers)  # pytest's own capture: this program set up none
    for handler in handlers:
        root.removeHandler(handler)
    try:
        with run_log("local", "run") as held:
            assert held is not None
            held.write_to(tmp_path)
            TROUPE_LINE.warning("in_the_file")
        TROUPE_LINE.warning("on_stderr")  # Python's last resort: no handler anywhere
    finally:
        for handler in handlers:
            root.addHandler(handler)
    err = capsys.readouterr().err
    assert "on_stderr" in err and "in_the_file" not in err
    assert [e["event"] for e in _events(tmp_path)] == ["in_the_file"]


def test_each_run_of_a_command_logs_to_its_own_file_and_gets_its_logging_back(
    command: _Kept, tmp_path: Path
) -> None:
    for name in ("first", "second"):
        with run_log("local", "run") as held:
            assert held is not None
            structlog.get_logger("troupe.test").info("held_before_the_file", run=name)
            held.write_to(tmp_path / name)
            structlog.get_logger("troupe.test").info("in_the_run", run=name)
        root = logging.getLogger()
        assert command in root.handlers and root.level == logging.INFO
        assert not any(isinstance(h, ReopeningFileHandler) for h in root.handlers)  # the run's file
    for name, other in (("first", "second"), ("second", "first")):
        text = _lines(tmp_path / name)
        assert f'"run": "{name}"' in text and "held_before_the_file" in text and "in_the_run" in text
        assert f'"run": "{other}"' not in text
    structlog.get_logger("mine").warning("after_the_runs")
    logging.getLogger("mine").warning("stdlib_after")
    said = command.said()
    assert any("after_the_runs" in m for m in said) and "stdlib_after" in said
    assert "after_the_runs" not in _lines(tmp_path / "first") + _lines(tmp_path / "second")


def test_a_run_leaves_a_command_whose_logging_is_configured_alone(command: _Kept, tmp_path: Path) -> None:
    structlog.configure(processors=[structlog.processors.JSONRenderer()])  # configure_logging's, say
    mine = structlog.get_config()
    with run_log("local", "run") as held:
        assert held is None
    assert structlog.get_config() == mine and command in logging.getLogger().handlers
