"""A folder seen read-only, as an archived dataset is: a bind mount remounted ``ro``, unmounted after.

``chmod`` does not stop root (CI runs as root), a read-only mount does. Mounting needs root;
where it is not permitted the test is skipped, with the reason. The mount is undone however the
test ends.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["read_only_mount"]


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@contextmanager
def read_only_mount(source: Path, where: Path | None = None) -> Iterator[Path]:
    """``source`` mounted read-only at ``where`` (made if missing; default: over ``source``
    itself, the folder archived in place)."""
    where = source if where is None else where
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command here: a read-only folder cannot be made")
    bound = _mount("--bind", str(source), str(where))
    if bound.returncode != 0:
        pytest.skip(f"a bind mount is not permitted here ({bound.stderr.strip() or bound.returncode})")
    try:
        remounted = _mount("-o", "remount,bind,ro", str(where))
        if remounted.returncode != 0:
            pytest.skip(f"a bind mount cannot be made read-only here ({remounted.stderr.strip()})")
        yield where
    finally:
        gone = subprocess.run(["umount", str(where)], capture_output=True, timeout=30)
        if gone.returncode != 0:  # something still holds a file open there: detach it anyway
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)
