"""A command that cannot start a process or a thread (a process limit reached: ``ulimit -u``, a
cgroup's ``pids.max``, threads counting; or a memory limit) says so in one ``error:`` line that
names the likely limit, exit 1. ``troupe run`` printed a 90-110 line ExceptionGroup traceback and
no ``error:`` line (report rs 6): only a lone troupe error was unwrapped. The failures are
raised here by the command's body, as the task group of a run raises them; one test sets a
real cgroup pids limit where the machine lets it, and is skipped elsewhere."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
import typer

from support.port_range import test_endpoint
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


PIDS_ROOT = Path("/sys/fs/cgroup/pids")  # cgroup v1's pids controller
WAIT_S = 300.0  # a bound on a refused run's start and stop on a loaded machine, not on speed


def test_a_run_under_a_real_pids_limit_says_one_line(tmp_path: Path) -> None:
    """The one real limit: a cgroup v1 pids.max of 8, where this machine lets the test make one
    (root, a writable pids hierarchy); skipped elsewhere."""
    group = PIDS_ROOT / f"troupe-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / "pids.max").write_text("8")
    except OSError as exc:
        if group.exists():
            group.rmdir()
        pytest.skip(f"no cgroup v1 pids limit can be set here ({exc})")
    try:
        node, master = test_endpoint(), test_endpoint()
        command = (
            f'echo $$ > {group}/cgroup.procs && exec "{sys.executable}" -m troupe.cli.main run --items 2 '
            f"--out {tmp_path / 'out'} --endpoint {node} --master {master}"
        )
        proc = subprocess.Popen(
            ["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            _, err = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        deadline = time.monotonic() + WAIT_S
        while (group / "pids.current").read_text().strip() != "0" and time.monotonic() < deadline:
            time.sleep(0.05)  # a bounded wait for what the run started to be gone
        group.rmdir()
    assert proc.returncode == 1, err
    said = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "pids.max" in said[0], err
    assert "Traceback" not in err, err
