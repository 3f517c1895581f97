"""A command whose output's reader has gone (``troupe demo | head -1``) ends with 141, as a
shell reports a command a closed pipe stopped, and says nothing: not a traceback of the task
group its write failed in (``demo``), not the silent status 1 rich and click gave (a run that
had finished read as failed). Each command here writes to a pipe whose reader is closed
before it starts, so its first write fails: no race with the reader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from troupe.cli.closed_output import OUTPUT_CLOSED

ENTRY = "from troupe.cli.entry import main; main()"
BOUND_S = 120  # against a hang only


def _with_closed_stdout(
    args: list[str], cwd: Path, how: tuple[str, ...] = ("-c", ENTRY)
) -> tuple[int, str, set[int]]:
    """``troupe ARGS`` through the console script's entry (or ``how``), stdout a pipe nobody
    reads: its status, its stderr, and what it left running in its session."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    proc = subprocess.Popen(
        [sys.executable, *how, *args],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    os.close(write_end)
    try:
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        left = {p.pid for p in psutil.process_iter(["pid"]) if _session(p) == proc.pid}
        if proc.poll() is None or left:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, err, left


def _session(p: psutil.Process) -> int | None:
    try:
        return os.getsid(p.pid)
    except OSError:
        return None


@pytest.mark.parametrize(
    "args",
    [["--version"], ["--help"], ["demo"], ["run", "--items", "2", "--out", "out"]],
    ids=["click-echo", "rich-help", "demo-task-group", "run"],
)
def test_a_closed_output_ends_the_command_with_141_and_no_word(tmp_path: Path, args: list[str]) -> None:
    code, err, left = _with_closed_stdout(args, tmp_path)
    assert code == OUTPUT_CLOSED, err
    assert "Traceback" not in err and "Error" not in err, err
    assert left == set()  # a node it had started is gone with its workers


def test_python_m_troupe_cli_main_ends_a_closed_output_the_same_way(tmp_path: Path) -> None:
    code, err, left = _with_closed_stdout(["demo"], tmp_path, ("-m", "troupe.cli.main"))
    assert code == OUTPUT_CLOSED and "Traceback" not in err, err
    assert left == set()


def test_a_run_stopped_by_its_closed_output_goes_on_when_run_again(tmp_path: Path) -> None:
    """The run stopped at its first line keeps what it committed; the same command finishes."""
    code, err, _ = _with_closed_stdout(["run", "--items", "2", "--out", "out"], tmp_path)
    assert code == OUTPUT_CLOSED, err
    again = subprocess.run(
        [sys.executable, "-c", ENTRY, "run", "--items", "2", "--out", "out"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=BOUND_S,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert again.returncode == 0, again.stderr
    assert "2 ok" in again.stdout or "already complete" in again.stdout, again.stdout
