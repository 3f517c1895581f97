"""The current folder is on the path of the processes troupe starts after the installed
packages: a user's stage module there imports, a scratch ``msgpack.py`` there is not msgpack.
The class check finds modules as they do, and a folder put ahead by ``PYTHONPATH`` is named. ev 5"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from troupe.lean_start import argv as lean_argv
from troupe.runtime.core.current_folder import find_spec_as_children_do, shadowing_problem
from troupe.runtime.core.loading import load_actor_class
from troupe.runtime.errors import ConfigError

STRAY = "raise SystemExit('the stray file of the current folder ran')\n"


def test_a_started_process_imports_the_installed_package_and_the_folder_s_own_module(
    tmp_path: Path,
) -> None:
    (tmp_path / "msgpack.py").write_text(STRAY)
    (tmp_path / "troupe_probe_here.py").write_text(
        "import json, msgpack\nprint(json.dumps({'msgpack': msgpack.__file__}))\n"
    )
    done = subprocess.run(
        lean_argv("troupe_probe_here"), cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert not json.loads(done.stdout)["msgpack"].startswith(str(tmp_path))


def test_the_class_check_finds_modules_as_the_started_processes_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also from a command run as ``python -m`` there, which has the folder first itself."""
    (tmp_path / "msgpack.py").write_text(STRAY)
    (tmp_path / "troupe_mine_here.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    for first in (False, True):
        if first:
            monkeypatch.syspath_prepend(str(tmp_path))
        installed = find_spec_as_children_do("msgpack")
        assert installed is not None and not str(installed.origin).startswith(str(tmp_path))
        mine = find_spec_as_children_do("troupe_mine_here")
        assert mine is not None and mine.origin == str(tmp_path / "troupe_mine_here.py")


def test_a_folder_on_pythonpath_that_shadows_a_package_troupe_imports_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "torch.py").write_text(STRAY)
    (tmp_path / "troupe_mine_here.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert shadowing_problem() is None  # after the installed packages: harmless
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert shadowing_problem() == (
        f"./torch.py in the current folder {tmp_path} shadows the installed torch, which troupe's "
        "processes import (the folder is on PYTHONPATH, ahead of the installed packages): rename it"
    )
    (tmp_path / "torch.py").unlink()
    assert shadowing_problem() is None  # its own modules, which nothing installed is named as


def test_a_stage_module_named_as_an_installed_one_is_said_to_be_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``code.py`` holding the stages: the standard library's ``code`` is imported, which has
    no Generate; the folder's file is named."""
    (tmp_path / "code.py").write_text("class Generate: pass\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        load_actor_class("code:Generate")
    assert "module 'code' has no 'Generate' (./code.py in the current folder is not the code imported" in str(
        refused.value
    )
