"""A command started in a folder that no longer exists (deleted under the shell) is refused in
one line, exit 2, before anything starts: ``troupe run`` printed two tracebacks and a false
"oneMKL FATAL ERROR" as its reason. ``ctl`` and ``--version`` need no folder and go on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from troupe.runtime.transports.loopback import free_endpoint

BOUND_S = 120.0  # against a hang only
# argv[1]: the folder to stand in, then delete; the rest: the command's arguments
IN_A_DELETED_FOLDER = """
import os, sys
os.chdir(sys.argv[1])
os.rmdir(sys.argv[1])
sys.argv = ["troupe", *sys.argv[2:]]
from troupe.cli.entry import main
main()
"""


def _troupe_in_a_deleted_folder(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", IN_A_DELETED_FOLDER, str(gone), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a run that was not refused is killed with all it started
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_troupe_run_in_a_deleted_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _troupe_in_a_deleted_folder(
        tmp_path,
        "run",
        "--items",
        "2",
        "--out",
        str(out),
        "--endpoint",
        free_endpoint(),
        "--master",
        free_endpoint(),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "error: the current folder no longer exists (deleted under this shell): cd to an existing folder"
    )
    assert not out.exists()  # nothing started


@pytest.mark.parametrize("args", [["--version"], ["ctl", "--help"], ["run", "--help"]])
def test_what_needs_no_folder_goes_on(tmp_path: Path, args: list[str]) -> None:
    done = _troupe_in_a_deleted_folder(tmp_path, *args)
    assert done.returncode == 0 and "error" not in done.stderr, done.stderr
