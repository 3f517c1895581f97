"""The error tree drawn in troupe.runtime.errors' docstring is the real one, whole.

Every subclass of TroupeError defined anywhere in troupe.runtime (errors.py or another module)
is drawn, under its real parent; nothing drawn is made up. Domain errors live in troupe.actors.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import troupe.runtime
from troupe.runtime import errors
from troupe.runtime.errors import TroupeError

_LINE = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>[A-Z]\w*)(?:\((?P<also>[\w, ]+)\))?(?:\s|$)")


def _drawn() -> dict[str, str | None]:
    """{class name: parent name} as drawn in the docstring (the root's parent is None)."""
    doc = errors.__doc__ or ""
    block = doc.split("::\n", 1)[1]
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    for raw in block.splitlines()[1:]:
        if not raw.strip():
            if parents:
                break
            continue
        line = raw[4:]  # the literal block's indentation
        match = _LINE.match(line)
        assert match, f"cannot read the tree line {raw!r}"
        depth = len(match["indent"]) // 4
        del stack[depth:]
        assert match["name"] not in parents, f"{match['name']} is drawn twice"
        parents[match["name"]] = stack[-1] if stack else None
        stack.append(match["name"])
    return parents


def _runtime_errors() -> dict[str, type[TroupeError]]:
    for info in pkgutil.walk_packages(troupe.runtime.__path__, prefix="troupe.runtime."):
        importlib.import_module(info.name)
    found: dict[str, type[TroupeError]] = {}
    todo: list[type[TroupeError]] = [TroupeError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("troupe.runtime"):
            found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def test_every_runtime_error_is_drawn_under_its_parent() -> None:
    """Each TroupeError subclass of troupe.runtime is in the docstring tree, under its real base."""
    drawn = _drawn()
    real = _runtime_errors()
    assert sorted(set(real) - set(drawn)) == [], "errors missing from the tree in errors.py"
    assert sorted(set(drawn) - set(real)) == [], "the tree draws errors that do not exist"
    for name, cls in real.items():
        bases = [b.__name__ for b in cls.__bases__ if issubclass(b, TroupeError)]
        assert drawn[name] == (bases[0] if bases else None), f"{name} is drawn under the wrong parent"


def test_the_runtime_defines_no_domain_error() -> None:
    """Errors about data and plans live with the actors that raise them, not in the runtime."""
    real = _runtime_errors()
    assert not {"InvalidData", "PlanFailed"} & set(real)
    from troupe.actors.datagen.errors import PlanFailed
    from troupe.actors.lerobot.errors import InvalidData

    assert errors.error_class("plan_failed") is PlanFailed
    assert errors.error_class("invalid_data") is InvalidData
