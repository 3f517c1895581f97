"""A task journal made to look as an older troupe left it: statements of SQL, then its version."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def as_older(path: Path, version: int, *statements: str) -> None:
    """Run ``statements`` on the journal at ``path`` (what that version lacked, taken away) and
    mark it ``version``."""
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {int(version)}")
        conn.commit()
    finally:
        conn.close()
