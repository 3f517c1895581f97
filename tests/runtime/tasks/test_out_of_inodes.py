"""A store whose volume is out of inodes, not of bytes, says so (``df -i``), and a run whose
finalize failed of a full disk after items died of it too says how many, and ``--retry-dead``:
the advice was "free space" on a disk 99% free, and the 24 items of 40 dead-lettered by the
same error were not mentioned until a rerun had exited 0 without them (report rs 4). The
volume's counts are a fake ``statvfs``; nothing is filled."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from troupe.runtime.errors import RemoteError
from troupe.runtime.pipeline.hook_calls import HookCalls, _hook_failed
from troupe.runtime.tasks import output_store
from troupe.runtime.tasks.output_store import as_commit_error

FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _volume(monkeypatch: pytest.MonkeyPatch, files: int, favail: int) -> None:
    counts = SimpleNamespace(f_files=files, f_favail=favail)
    monkeypatch.setattr(output_store.os, "statvfs", lambda _path: counts)


def test_enospc_with_no_inodes_left_is_said_as_inodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _volume(monkeypatch, files=120, favail=3)
    said = str(as_commit_error(FULL, action="committing the output", root=tmp_path / "out" / "store"))
    assert f"free inodes on the volume holding {tmp_path / 'out' / 'store'}: 3 of 120 free" in said
    assert "df -i" in said and "free space" not in said


@pytest.mark.parametrize(("files", "favail"), [(10**7, 5 * 10**6), (0, 0)], ids=["plenty", "uncounted"])
def test_enospc_with_inodes_to_spare_is_said_as_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int, favail: int
) -> None:
    _volume(monkeypatch, files, favail)
    said = str(as_commit_error(FULL, action="committing the output", root=tmp_path))
    assert f"free space on the volume holding {tmp_path}" in said and "df -i" not in said


def _engine(outcomes: dict[str, str], errors: dict[str, str]) -> HookCalls:
    engine = HookCalls.__new__(HookCalls)  # the engine's part that calls the hooks: its records only
    engine._outcomes, engine._errors = outcomes, errors
    return engine


def test_a_finalize_failed_of_a_full_disk_counts_the_items_that_died_of_it() -> None:
    dead_error = "CommitError: task 'i-1': committing the output failed (No space left on device); ..."
    engine = _engine(
        {"i-0": "ok", "i-1": "dead", "i-2": "dead", "i-3": "dead"},
        {"i-1": dead_error, "i-2": dead_error, "i-3": "ValueError: bad frame"},
    )
    failed = RemoteError(
        "troupe.runtime.errors.CommitError", "[Errno 28] finalizing failed (No space left on device)"
    )
    said = str(_hook_failed("store", "finalize", failed, engine._dead_of_a_full_disk(failed)))
    assert said.startswith("stage store: finalize failed: ")
    assert "; 2 item(s) of this run died of a full disk too (dead-lettered)" in said
    assert "run it again with --retry-dead" in said


def test_a_finalize_failed_of_something_else_says_nothing_of_the_dead() -> None:
    engine = _engine({"i-1": "dead"}, {"i-1": "No space left on device"})
    assert engine._dead_of_a_full_disk(RemoteError("builtins.ValueError", "bad")) == ""
