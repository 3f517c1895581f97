"""A small disk for a test: a tmpfs of a given size mounted on a folder, unmounted after.

Mounting needs root (CI runs as root); where it is not permitted the test is skipped, with
the reason. Only the folder given is mounted over, and it is unmounted however the test ends.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["small_disk"]


@contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """``where`` (made if missing) as a tmpfs of ``size`` (``mount -o size=``: ``3m``, ``64k``)."""
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command here: a small disk cannot be made")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here ({done.stderr.strip() or done.returncode})")
    try:
        yield where
    finally:
        gone = subprocess.run(["umount", str(where)], capture_output=True, timeout=30)
        if gone.returncode != 0:  # something still holds a file open there: detach it anyway
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)
