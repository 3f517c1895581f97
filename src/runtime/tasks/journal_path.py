"""How long a journal's path may be: SQLite's own limit, said before anything is made.

SQLite's unix file system layer opens a database whose path (links resolved, made absolute)
fits 512 bytes with the ``-journal`` it adds for its rollback journal's name: 504 bytes. A
longer one fails as "unable to open database file", which read as a permission problem (the
folder was writable; the file was even created).
"""

from __future__ import annotations

import os

__all__ = ["LONGEST_PATH", "path_length_problem"]

_SQLITE_PATH_MAX = 512  # MAX_PATHNAME of SQLite's unix VFS
LONGEST_PATH = _SQLITE_PATH_MAX - len("-journal")


def path_length_problem(path: str | os.PathLike[str]) -> str | None:
    """Why SQLite cannot open a database at ``path`` for its length, or None; to follow "is" in
    a message: ``a path of 509 bytes; SQLite opens at most 504 (...)``."""
    size = len(os.fsencode(os.path.realpath(path)))  # as SQLite measures it: absolute, links resolved
    if size <= LONGEST_PATH:
        return None
    return (
        f"a path of {size} bytes; SQLite opens at most {LONGEST_PATH} "
        f"({_SQLITE_PATH_MAX} with the '-journal' it adds)"
    )
