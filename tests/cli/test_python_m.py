"""``python -m troupe`` and ``python -m troupe.cli`` run the command (they said "No module named
troupe.__main__"): what a user reaches for where the venv's ``bin/`` is not on the PATH (cron, a
service's ExecStart, sudo with a reset PATH), and the current folder's files do not shadow the
installed packages there, as they do not under the console script (report pk 2)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

BOUND_S = 120.0  # against a hang only


@pytest.mark.parametrize("module", ["troupe", "troupe.cli"])
def test_python_m_runs_the_command(module: str, tmp_path: Path) -> None:
    (tmp_path / "msgpack.py").write_text("raise SystemExit('the scratch msgpack.py was imported')\n")
    done = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=BOUND_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert version("troupe") in done.stdout


def test_python_m_in_a_deleted_folder_says_so_in_one_line(tmp_path: Path) -> None:
    """It failed with a traceback of its own (os.getcwd() in troupe's __main__), where the
    console script says the folder is gone (report rg 7)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"import os, runpy, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
    script += "sys.argv = ['troupe', 'run']; runpy.run_module('troupe', run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=BOUND_S
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "the current folder no longer exists" in done.stderr
