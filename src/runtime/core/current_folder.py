"""The current folder on the path of the processes troupe starts: after the installed packages.

A user's own stage modules are looked for in the folder a run or a node starts in (README,
"Your own pipeline"). The processes a node starts (template, workers, supervisor, the class
check's child) run as ``python -P -m troupe.lean_start``, which puts that folder at the end of
``sys.path``: a scratch ``torch.py`` there is not what every worker imports as torch.
:func:`find_spec_as_children_do` finds a module as they do, for checks made in a process with
another path (the CLI's console script).

Only a folder put ahead of the installed packages by the user (``PYTHONPATH=.``) can still
shadow one: :func:`shadowing_problem` names the file, before anything starts.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from functools import cache

__all__ = ["find_spec_as_children_do", "hidden_module_hint", "shadowing_problem"]


def find_spec_as_children_do(name: str) -> importlib.machinery.ModuleSpec | None:
    """``importlib.util.find_spec(name)`` on the path of the processes troupe starts, with the
    current folder after the installed packages (``lean_start``): this process has its own
    path (a console script's folder first, or the current folder, under ``python -m``)."""
    saved = sys.path[:]
    sys.path[:] = _children_path(os.getcwd())
    try:
        return importlib.util.find_spec(name)
    finally:
        sys.path[:] = saved


def shadowing_problem() -> str | None:
    """Why a file of the current folder would be imported by the processes troupe starts in
    place of a module they import (``./torch.py`` with the folder on ``PYTHONPATH``), or None.
    Left alone: a module of the folder that nothing installed is named as."""
    try:
        here = os.getcwd()
    except OSError:  # a deleted folder holds nothing
        return None
    for name, shown in _modules_in(here):
        spec = _top_level_spec(name, _children_path(here))
        if spec is None or not _inside(spec, name, here):
            continue  # the installed one comes first
        installed = _top_level_spec(name, [p for p in sys.path if p not in ("", here)])
        if installed is None or name not in _imported_by_troupe():
            continue
        # Only PYTHONPATH puts the folder ahead (_children_path): elsewhere, an installed one wins.
        return (
            f"./{shown} in the current folder {here} shadows the installed {name}, which troupe's "
            "processes import (the folder is on PYTHONPATH, ahead of the installed packages): rename it"
        )
    return None


def hidden_module_hint(module_name: str) -> str:
    """For a class its module lacks: the current folder holds a file of that module's name,
    which is not the module imported (an installed or standard one comes first); else ''."""
    try:
        here = os.getcwd()
    except OSError:
        return ""
    top = module_name.partition(".")[0]
    shown = next((shown for name, shown in _modules_in(here) if name == top), None)
    if shown is None or _from_folder(getattr(sys.modules.get(top), "__file__", None), top, here):
        return ""
    return (
        f" (./{shown} in the current folder is not the {top} imported: installed packages and the "
        f"standard library come first; rename the file, and the class path with it)"
    )


def _modules_in(folder: str) -> list[tuple[str, str]]:
    """The top-level modules ``folder`` holds: (name, how the folder shows it), sorted."""
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return []
    found = []
    for entry in entries:
        name, ext = os.path.splitext(entry.name)
        with contextlib.suppress(OSError):
            if ext == ".py" and name.isidentifier() and entry.is_file():
                found.append((name, entry.name))
            elif (
                not ext
                and entry.name.isidentifier()
                and os.path.isfile(os.path.join(entry.path, "__init__.py"))
            ):
                found.append((entry.name, f"{entry.name}/"))
    return found


def _children_path(here: str) -> list[str]:
    """``sys.path`` as the processes troupe starts have it: the current folder last (``-P``,
    then ``lean_start``), or ahead of the installed packages where ``PYTHONPATH`` puts it."""
    path = [p for p in sys.path if p not in ("", here)]
    return [here, *path] if here in _pythonpath() else [*path, here]


def _pythonpath() -> list[str]:
    """``PYTHONPATH``'s folders, absolute (an empty entry is the current folder)."""
    value = os.environ.get("PYTHONPATH")
    return [os.path.abspath(p or ".") for p in value.split(os.pathsep)] if value else []


def _top_level_spec(name: str, path: list[str]) -> importlib.machinery.ModuleSpec | None:
    if name in sys.builtin_module_names:
        return importlib.machinery.BuiltinImporter.find_spec(name)
    return importlib.machinery.PathFinder.find_spec(name, path)


def _inside(spec: importlib.machinery.ModuleSpec, name: str, folder: str) -> bool:
    return spec.has_location and _from_folder(spec.origin, name, folder)


def _from_folder(file: str | None, name: str, folder: str) -> bool:
    """Whether ``file``, the origin of top-level module ``name``, is ``folder``'s own."""
    if file is None:
        return False
    return os.path.dirname(os.path.abspath(file)) in (folder, os.path.join(folder, name))


@cache
def _imported_by_troupe() -> frozenset[str]:
    """The top-level modules troupe's processes import: what this process has imported, and
    the packages of troupe's dependencies, with theirs (torch, which the CLI leaves to them)."""
    from importlib import metadata

    names = {name.partition(".")[0] for name in sys.modules}
    wanted: set[str] = set()
    todo = ["troupe"]
    while todo:
        dist = _normal(todo.pop())
        if dist in wanted:
            continue
        wanted.add(dist)
        try:
            requires = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            if "extra" in requirement.partition(";")[2]:  # a test or lint extra: not imported by a run
                continue
            if match := re.match(r"[A-Za-z0-9._-]+", requirement):
                todo.append(match.group())
    for top, dists in metadata.packages_distributions().items():
        if any(_normal(dist) in wanted for dist in dists):
            names.add(top)
    return frozenset(names)


def _normal(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()
