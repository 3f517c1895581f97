"""A `troupe run` folder whose disk takes nothing as the run starts, and a folder adopted by a
run that then failed to start: one line, and the folder left as it was."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from troupe.actors.datagen.config import default_pipeline
from troupe.runtime.errors import CommitError
from troupe.runtime.pipeline import run_record
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.pipeline.run_fingerprint import fingerprint


def test_a_record_the_disk_has_no_room_for_is_said_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path: Path, record: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(run_record, "write_record", full)
    run = RunDir(tmp_path / "out")
    with pytest.raises(CommitError) as raised:
        run.prepare(fingerprint(default_pipeline(items=8)), fresh=False)
    said = str(raised.value)
    assert "\n" not in said
    assert f"recording the run in {run.record_path} failed (No space left on device)" in said
    assert "free space on the volume holding" in said and "run the same command again" in said
    assert run.lock is None  # released: the next command may take the folder


def test_an_adopted_folder_whose_run_failed_to_start_is_left_without_a_record(tmp_path: Path) -> None:
    """Its record deleted (its copy too), a folder that holds no output is adopted with the
    command's pipeline; a run that then fails before anything ran (its journal's job was made
    with other items) takes the record back, so the command that matches the job adopts it."""
    out = tmp_path / "out"
    first = RunDir(out)
    first.prepare(fingerprint(default_pipeline(items=8)), fresh=False)
    first.release()
    (out / "data").mkdir()  # what the finished run made
    first.record_path.unlink()
    first.copy_path.unlink()
    wrong = RunDir(out)
    wrong.prepare(fingerprint(default_pipeline(items=64)), fresh=False)
    assert wrong.adopted and wrong.record_path.is_file()
    wrong.unadopt()
    wrong.release()
    assert not wrong.record_path.exists() and not wrong.adopted
    right = RunDir(out)
    assert right.prepare(fingerprint(default_pipeline(items=8)), fresh=False) is None
    assert right.adopted
    right.release()


def test_unadopt_leaves_a_record_it_did_not_write(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "out")
    run.prepare(fingerprint(default_pipeline(items=8)), fresh=False)
    assert not run.adopted  # a new folder: its record is this run's own
    run.unadopt()
    assert run.record_path.is_file()
    run.release()
