"""A class whose own module is missing says where modules were looked for; one whose module
is found but fails on its own import says only what failed."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from troupe.runtime.core.loading import load_actor_class
from troupe.runtime.errors import ConfigError


def test_a_missing_module_names_the_folder_it_was_looked_for_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        load_actor_class("troupe_absent_stages:Generate")
    message = str(refused.value)
    assert "No module named 'troupe_absent_stages'" in message
    assert f"the current folder {tmp_path}" in message and "holds troupe_absent_stages.py" in message


def test_a_missing_package_is_named_as_a_folder() -> None:
    with pytest.raises(ConfigError, match=r"holds troupe_absent_pkg/, or add that folder to PYTHONPATH"):
        load_actor_class("troupe_absent_pkg.stages:Generate")


def test_what_a_found_module_fails_to_import_gets_no_folder_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "troupe_needs_dep.py").write_text("import troupe_absent_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as refused:
        load_actor_class("troupe_needs_dep:Stage")
    message = str(refused.value)
    assert "No module named 'troupe_absent_dependency'" in message and "current folder" not in message
    with pytest.raises(ConfigError) as inside:
        load_actor_class("troupe.absent_module:Stage")  # the package is found, not the module
    assert "current folder" not in str(inside.value)


def test_a_module_named_without_its_class_says_how_to_write_it() -> None:
    """``class = "mypkg.actors"`` read as class ``actors`` of ``mypkg``: 'has no actors' sent the
    user looking for a file that was there. Said the same once the module is imported (its
    package then holds it as an attribute: any earlier test in this process may have imported it)."""
    for imported in (False, True):
        if imported:
            importlib.import_module("troupe.actors.demo.actors")
        with pytest.raises(
            ConfigError, match=r"'troupe.actors.demo.actors' names a module, not a class: write it as "
        ):
            load_actor_class("troupe.actors.demo.actors")
    with pytest.raises(ConfigError, match=r"module 'os\.path' has no 'Nope'"):  # a module's parent
        load_actor_class("os.path.Nope")


def test_a_class_in_the_script_being_run_says_to_move_it_into_a_module() -> None:
    """``actor = "__main__:Double"``, the class defined in the user's script: each process has a
    __main__ of its own, so 'module __main__ has no Double' sent the user looking for a typo."""
    with pytest.raises(ConfigError, match=r"is in the script being run \(__main__\).*'module:Double'"):
        load_actor_class("__main__:Double")
