"""The keys of a ``--json`` output that docs/METRICS.md ("The `--json` outputs") does not name.

The doc names each key by its path: ``.`` between keys, ``[]`` for a list's elements, ``*`` for
a key that is a name (a stage's, a worker's); a cell may name several, the later ones by their
last part (`` `workers[].kind`, `.state` ``). A script reads what the doc says: a key added to
an output without a row there fails the test that took the output. One output of several
shapes has a table per shape, its heading saying which (`` `troupe run --json` (a training
config) ``): ``of`` names it, and without it the first table of the output is read.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "METRICS.md"


@cache
def documented(output: str, of: str = "") -> frozenset[str]:
    """The paths the doc's table for ``output`` (its heading: `` `troupe run --json` ``) names;
    ``of``: the shape the heading names after it, in brackets (``a training config``)."""
    text = DOC.read_text(encoding="utf-8")
    shape = rf" \({re.escape(of)}\)" if of else ""
    heading = re.search(rf"^### `{re.escape(output)}`{shape}.*$", text, re.M)
    assert heading is not None, f"docs/METRICS.md has no section for `{output}`" + (f" ({of})" if of else "")
    section = text[heading.end() :].split("\n#", 1)[0]
    paths: set[str] = set()
    for row in re.findall(r"^\| (`[^|]*`) \|", section, re.M):
        names = re.findall(r"`([^`]+)`", row)
        parent = names[0].rsplit(".", 1)[0] if "." in names[0] else ""
        paths.update(parent + name if name.startswith(".") else name for name in names)
    assert paths, f"docs/METRICS.md's table for `{output}` names no key"
    return frozenset(paths)


def leaf_paths(value: Any, prefix: str = "") -> list[str]:
    """Every path to a value that is not an object, nor a list of objects (an empty one: none)."""
    if isinstance(value, dict) and value:
        return [p for k, v in value.items() for p in leaf_paths(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return sorted({p for v in value for p in leaf_paths(v, prefix + "[]")})
    return [prefix] if prefix and value not in ({}, []) else []  # an empty one names no key


def undocumented(output: str, value: Any, of: str = "") -> list[str]:
    """The paths of ``value`` (the output of ``output``, of the shape ``of``) that no row of its
    table names."""
    patterns = [
        re.compile(
            "".join("[^.]+" if part == "*" else re.escape(part) for part in re.split(r"(\*)", p)) + r"\Z"
        )
        for p in documented(output, of)
    ]
    return [path for path in leaf_paths(value) if not any(p.match(path) for p in patterns)]
