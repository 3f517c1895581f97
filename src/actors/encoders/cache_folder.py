"""The latent cache's disk folder: what in it is the cache's own, and setting a damaged index aside.

The folder is the user's to name (``encoders.cache_dir``), so the cache touches only what
diskcache writes there: its index (``cache.db`` and SQLite's ``-wal`` / ``-shm`` beside it) and
its entry files (``ab/cd/<28 hex>.val``). A damaged index used to move the whole folder to
``<dir>.damaged``, and the next one deleted that, with whatever the user kept in it.

Example::

    problem = foreign_problem(Path("/var/cache/latents"), "encoders.cache_dir")
    if problem:
        raise ConfigError(problem)
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["DAMAGED_INDEX", "INDEX", "foreign_entries", "foreign_problem", "set_index_aside"]

INDEX = "cache.db"  # diskcache's DBNAME
DAMAGED_INDEX = f"{INDEX}.damaged"  # a damaged index kept for a look (one: the newest)
_INDEX_FILES = (INDEX, f"{INDEX}-wal", f"{INDEX}-shm", f"{INDEX}-journal")
_OWN_FILES = frozenset((*_INDEX_FILES, DAMAGED_INDEX))
_ENTRY_DIR = re.compile(r"[0-9a-f]{2}")  # diskcache's two levels of sub-folders
_ENTRY_FILE = re.compile(r"[0-9a-f]{28}\.val")


def foreign_entries(directory: Path) -> list[str]:
    """The names in ``directory`` (sorted) the cache did not write: none for a folder that does
    not exist yet, or holds only the index and entry folders. The entry folders are looked at two
    levels deep (the folders diskcache makes), not file by file: a big cache lists at once."""
    try:
        entries = sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    foreign = []
    for path in entries:
        if not path.exists() and not path.is_symlink():
            continue  # gone since the listing (another process's index closed, its -shm deleted)
        if path.name in _OWN_FILES and path.is_file() and not path.is_symlink():
            continue
        if _is_entry_dir(path) and all(_is_entry_dir(sub) for sub in _listed(path)):
            continue
        foreign.append(path.name)
    return foreign


def foreign_problem(directory: Path, what: str) -> str | None:
    """One line refusing ``directory`` where it holds files the cache did not write, else None."""
    foreign = foreign_entries(directory)
    if not foreign:
        return None
    return (
        f"{what} {directory} holds {foreign[0]!r}, which the latent cache did not write; give it a "
        f"folder of its own, new or empty (the cache writes {INDEX} and its entry folders there, and "
        "deletes them when its index is damaged)"
    )


def set_index_aside(directory: Path) -> Path:
    """Move a damaged index to ``DAMAGED_INDEX`` (replacing an older one), and delete the files
    of its entries (no index knows them now) and the index's other files: the folder then holds
    nothing the cache reads, and starts empty. Only the cache's own files are touched.

    Returns:
        Where the damaged index now lies.
    """
    aside = directory / DAMAGED_INDEX
    (directory / INDEX).replace(aside)
    for name in _INDEX_FILES[1:]:
        (directory / name).unlink(missing_ok=True)
    for top in sorted(directory.iterdir()):
        if not _is_entry_dir(top):
            continue
        for sub in sorted(top.iterdir()):
            if not _is_entry_dir(sub):
                continue
            for entry in sub.iterdir():
                if _ENTRY_FILE.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
                    entry.unlink()
            _remove_if_empty(sub)
        _remove_if_empty(top)
    return aside


def _is_entry_dir(path: Path) -> bool:
    return bool(_ENTRY_DIR.fullmatch(path.name)) and path.is_dir() and not path.is_symlink()


def _listed(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:  # unreadable: not looked into, as the cache could not have used it
        return []


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # something else lies in it: not the cache's to delete
        pass
