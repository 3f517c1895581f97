"""The sha256 of every file under a folder, by relative path: two datasets written the same
way compare equal byte for byte."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
