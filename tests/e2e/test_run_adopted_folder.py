"""A finished `troupe run` folder whose record was deleted: a command with other items is
refused by the copy of the pipeline kept beside the record, and binds nothing; the right
command gets the record back from it, and an output deleted since is said to be checked and
is made again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.cluster import ctl
from support.run_resume_helpers import dataset_task_ids, run_args, small_pipeline

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(300)
def test_a_wrong_command_into_a_folder_whose_record_was_deleted_is_refused(tmp_path: Path) -> None:
    config, out = small_pipeline(tmp_path), tmp_path / "out"
    first = ctl(*run_args(config, out, 2), timeout=200)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr
    (out / ".troupe" / "run.json").unlink()

    wrong = ctl(*run_args(config, out, 3), timeout=120)
    assert wrong.returncode == 2, wrong.stdout[-2000:] + wrong.stderr
    assert "was made with items=2, this run asks items=3" in wrong.stderr, wrong.stderr
    assert "Traceback" not in wrong.stderr
    assert not (out / ".troupe" / "run.json").exists()  # it bound nothing

    committed = out / ".troupe" / "episodes" / "committed"
    gone = sorted(committed.iterdir())[0]
    shutil.rmtree(gone)
    right = ctl(*run_args(config, out, 2), timeout=200)
    assert right.returncode == 0, right.stdout[-2000:] + right.stderr
    said = " ".join(right.stdout.split() + right.stderr.split())
    assert "run.json was missing: rebuilt from made_with.json beside it" in said, said
    assert "every item was done by an earlier run; checking their outputs, then finalising" in said, said
    assert f"made again: {gone.name}" in said, said
    total, ids = dataset_task_ids(out)
    assert total == 2 and sorted(ids) == sorted(p.name for p in committed.iterdir())
