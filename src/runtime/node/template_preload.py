"""What a node's template imports ahead, and what it can tell from what it imported.

A name is a module, or a class (``pkg.mod:Class``) whose module is imported and then what the
class names in ``preload_modules`` (what it imports lazily: torch, say). The template imports the
classes first and, where something they preload is still missing, forks its light sibling before
it imports the rest (``template.fork_light``): :func:`complete_classes` says which workers the
sibling can fork.
"""

from __future__ import annotations

import importlib
import json
import socket
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["complete_classes", "preload", "preloads_pending", "telling"]


def telling(sock: socket.socket) -> Callable[[str], None]:
    """Tell the node what is imported next (``{"importing": name}``, before the hello): a
    module that hangs as it imports is named while the node waits, not after its timeout.
    Never blocks: a message the socket has no room for is dropped (the next one says more)."""

    def tell(name: str) -> None:
        try:
            sock.send(json.dumps({"importing": name}).encode(), socket.MSG_DONTWAIT)
        except OSError:
            pass

    return tell


def preload(
    names: list[str],
    tell: Callable[[str], None] | None = None,
    seen: set[str] | None = None,
    lazy: bool = True,
) -> tuple[list[str], dict[str, str]]:
    """Import ``names``: modules, or classes (``pkg.mod:Class``) whose module is imported and
    then what the class names in ``preload_modules`` (what it imports lazily: torch, say); a
    module alone brings what each class defined in it names so (a node's ``preload`` of an
    actors' module makes every actor there start fast, as naming each class would).
    One that fails is skipped (its worker imports it as a spawned one would, and reports the
    error there). ``tell`` is told each name before its import (``telling``); ``lazy``: False
    leaves out what the classes name in ``preload_modules`` (a template for a check alone)."""
    imported: list[str] = []
    skipped: dict[str, str] = {}
    seen = set() if seen is None else seen  # a class naming its own module is imported once
    for name in dict.fromkeys(names):
        if name in seen:
            continue
        seen.add(name)
        module = name.partition(":")[0]
        if tell is not None and module not in sys.modules:
            tell(name)
        try:
            importlib.import_module(module)
            imported.append(module)
            extra = _extras([name]) if lazy else []
            if extra:
                more, failed = preload(extra, tell, seen)
                imported += more
                skipped.update(failed)
        except BaseException as exc:  # a module's import may even sys.exit
            skipped[name] = f"{type(exc).__name__}: {exc}"[:300]
    return imported, skipped


def preloads_pending(names: list[str], skipped: dict[str, str]) -> bool:
    """Whether a class among ``names`` (imported) preloads a module not imported yet."""
    return not _has_all(n for n in names if n not in skipped)


def complete_classes(names: Iterable[str]) -> list[str]:
    """The classes among ``names`` (``pkg.mod:Class``) imported here along with all they
    preload: a worker of these alone needs nothing more than this process has."""
    return [
        n for n in dict.fromkeys(names) if ":" in n and n.partition(":")[0] in sys.modules and _has_all([n])
    ]


def _has_all(names: Iterable[str]) -> bool:
    """Whether every module the imported classes or modules among ``names`` preload is imported."""
    return all(m in sys.modules for m in _extras(names))


def _extras(names: Iterable[str]) -> list[str]:
    """What the imported classes or modules among ``names`` name in ``preload_modules``."""
    found: list[str] = []
    for name in names:
        module, _, cls_name = name.partition(":")
        loaded = sys.modules.get(module)
        if loaded is None:
            continue
        classes = [getattr(loaded, cls_name, None)] if cls_name else _classes_of(loaded)
        found += [m for cls in classes for m in _lazy_imports(cls)]
    return found


def _classes_of(module: Any) -> list[type]:
    """The classes ``module`` defines itself (not those it imports)."""
    name = module.__name__
    return [c for c in vars(module).values() if isinstance(c, type) and c.__module__ == name]


def _lazy_imports(cls: Any) -> list[str]:
    """The modules a class names in ``preload_modules`` (none where it names none, or not as a
    tuple or list)."""
    extra = getattr(cls, "preload_modules", ())
    return [str(m).partition(":")[0] for m in extra] if isinstance(extra, tuple | list) else []
