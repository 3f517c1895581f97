"""troupe.lean_start: ``python -m`` for workers and supervisors, without rich behind structlog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
import structlog.dev
import rich  # importable again once structlog is in
print(json.dumps({"name": __name__, "argv": sys.argv, "structlog_rich": structlog.dev.rich is not None}))
"""


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "troupe.lean_start", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_runs_the_module_as_main_with_its_arguments_and_structlog_without_rich(tmp_path: Path) -> None:
    (tmp_path / "lean_probe.py").write_text(PROBE)
    done = _run(["lean_probe", "--flag", "x"], tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["name"] == "__main__" and got["structlog_rich"] is False
    assert got["argv"][0].endswith("lean_probe.py") and got["argv"][1:] == ["--flag", "x"]  # as -m sets it


def test_without_a_module_it_says_how_to_call_it(tmp_path: Path) -> None:
    done = _run([], tmp_path)
    assert done.returncode == 1
    assert "usage: python -m troupe.lean_start MODULE" in done.stderr


def test_a_module_its_package_imports_runs_without_runpy_s_warning_on_stderr(tmp_path: Path) -> None:
    """The class check's child (troupe.runtime.core.loading, which its package imports) reports
    a module that ended it by its stderr: runpy's warning was taken for those last words."""
    package = tmp_path / "lean_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from . import child\n")
    (package / "child.py").write_text("import sys\nif __name__ == '__main__':\n    sys.exit(3)\n")
    done = _run(["lean_pkg.child"], tmp_path)
    assert done.returncode == 3
    assert done.stderr == ""


def test_the_current_folder_is_on_the_path_even_with_pythonsafepath(tmp_path: Path) -> None:
    """A user's stage modules are looked for in the current folder: with ``PYTHONSAFEPATH`` set,
    ``python -m`` leaves it off, and the own-pipeline example was refused as 'No module named
    stages' (looked for in the current folder, which held stages.py). ev 12"""
    (tmp_path / "lean_here.py").write_text("print('found')\n")
    done = subprocess.run(
        [sys.executable, "-m", "troupe.lean_start", "lean_here"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONSAFEPATH="1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "found\n"
