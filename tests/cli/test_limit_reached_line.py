"""A command that cannot start a process or a thread (a process limit reached: ``ulimit -u``, a
cgroup's ``pids.max``, threads counting; or a memory limit) says so in one ``error:`` line that
names the likely limit, exit 1. ``troupe run`` printed a 90-110 line ExceptionGroup traceback and
no ``error:`` line (report rs 6): only a lone troupe error was unwrapped. The failures are
raised here by the command's body, as the task group of a run raises them. A real pids limit
is not tested: which thread it refuses first is a race, and where it is libzmq's own I/O thread,
libzmq aborts the process (SIGABRT, "Resource temporarily unavailable (src/thread.cpp)") before
Python can say anything (CI saw it; noted in README)."""

from __future__ import annotations

import errno
import os

import anyio
import pytest
import typer

from troupe.cli.client import run_async


def _in_a_task_group(error: BaseException) -> None:
    async def body() -> None:
        async def fails() -> None:
            raise error

        async with anyio.create_task_group() as tg:
            tg.start_soon(fails)

    run_async(body)


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN)),
            "could not start a process: Resource temporarily unavailable (a process limit: ulimit -u, "
            "cgroup pids.max)",
        ),
        (OSError(errno.ENOMEM, os.strerror(errno.ENOMEM)), "(a memory limit: ulimit -v"),
        (RuntimeError("can't start new thread"), "could not start a thread (can't start new thread): "),
    ],
    ids=["EAGAIN", "ENOMEM", "thread"],
)
def test_a_lone_failed_start_is_one_error_line(
    error: BaseException, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as exit_:
        _in_a_task_group(error)
    assert exit_.value.exit_code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], err


def test_the_thread_line_names_the_process_limit_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit):
        _in_a_task_group(RuntimeError("can't start new thread"))
    assert "pids.max" in capsys.readouterr().err


def test_other_errors_are_not_taken_for_a_limit() -> None:
    """A file's OSError, or another RuntimeError, is no failed start: raised as before."""
    for error in (PermissionError(errno.EACCES, "Permission denied"), RuntimeError("boom")):
        with pytest.raises(BaseExceptionGroup):
            _in_a_task_group(error)
