"""A path of an exact length in bytes under a folder, its parent made (folders of 100 bytes)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["path_of_length"]


def path_of_length(under: Path, size: int, name: str) -> Path:
    """``under/ddd.../ddd.../name``, ``size`` bytes long once resolved (``under`` shorter than
    ``size`` by 110 bytes at least), its parent folder made."""
    base = os.path.realpath(under)
    room = size - len(os.fsencode(base)) - len(name) - 1  # for the folders, each with its slash
    assert room > 101, f"{under} is too long for a path of {size} bytes"
    parts = ["d" * 100] * (room // 101 - 1)
    parts.append("d" * (room - 101 * len(parts) - 1))  # 100 to 200 bytes: within NAME_MAX
    folder = Path(base, *parts)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    assert len(os.fsencode(str(path))) == size, (len(str(path)), size)
    return path
