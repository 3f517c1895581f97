"""Which troupe code this process runs: the package version and a digest of its source files.

The version alone (``0.1.0``) stays the same from one checkout to the next, so a cluster whose
master, nodes and operators' commands run different code looked uniform. The digest changes
whenever a ``.py`` file of the package does, however it was installed: from a git checkout
(editable: ``troupe`` is ``src/``, ``troupe.cli`` is ``tools/``) or from a wheel (both under
``site-packages/troupe``). Files are named by their path in the package (``troupe/cli/...``),
so the same code gives the same digest either way.

It is computed once per process, on first use, never at import: reading the 2 MB of source
takes milliseconds that a worker forked from the node's template, or a command that never asks,
should not pay. A node's beat (``code`` in ``node_beat``), a master's ``status``, ``troupe
--version`` and ``troupe run --cluster``'s check of the cluster ask for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import troupe

__all__ = ["code_digest", "code_identity", "package_roots", "source_digest", "version"]

DIGEST_CHARS = 8
"""Hex characters of the digest shown: enough to tell checkouts apart at a glance."""

_DIGEST: str | None = None  # this process's, once computed


def version() -> str:
    """The installed troupe's version (its package metadata), or ``unknown``."""
    try:
        return metadata.version("troupe")
    except metadata.PackageNotFoundError:
        return "unknown"


def package_roots() -> dict[str, Path]:
    """Where this process's troupe source lies: its path in the package -> its folder."""
    roots = {"troupe": Path(troupe.__file__).parent}
    cli = find_spec("troupe.cli")  # imports nothing of it: tools/ in a checkout, troupe/cli in a wheel
    if cli is not None and cli.submodule_search_locations:
        roots["troupe/cli"] = Path(next(iter(cli.submodule_search_locations)))
    return roots


def source_digest(roots: Mapping[str, Path]) -> str:
    """A digest of every ``.py`` file under ``roots`` (package path -> folder), by its package
    path and its bytes; a file found under two roots (a wheel's ``troupe/cli``) counts once."""
    files: dict[str, Path] = {}
    for prefix, folder in roots.items():
        for path in folder.rglob("*.py"):
            if "__pycache__" not in path.parts:
                files[f"{prefix}/{path.relative_to(folder).as_posix()}"] = path
    digest = hashlib.sha256()
    for name in sorted(files):
        data = files[name].read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:DIGEST_CHARS]


def code_digest() -> str:
    """This process's source digest, computed on the first call (see the module)."""
    global _DIGEST
    if _DIGEST is None:
        try:
            _DIGEST = source_digest(package_roots())
        except OSError:  # a file unreadable or gone (an upgrade under way): said, not fatal
            _DIGEST = "unknown"
    return _DIGEST


def code_identity() -> str:
    """This process's build identity, as beats and statuses carry it: ``0.1.0+3f9a1c2e``."""
    return f"{version()}+{code_digest()}"
