"""A finished run's folder that cannot be written (a read-only mount: an archive) still answers a
rerun of its pipeline from its record, taking no lock and writing nothing; anything else there
is refused as ever (report up 7: the rerun said `cannot write`, exit 2, and a script could not
tell a complete dataset from a broken one). On tmp_path, with bind mounts remounted read-only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from support.read_only_mount import read_only_mount
from troupe.actors.datagen.config import default_pipeline
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.pipeline.run_dir_read_only import found_here
from troupe.runtime.pipeline.run_fingerprint import fingerprint
from troupe.runtime.pipeline.run_plan import check_early
from troupe.runtime.tasks.journal_lock import JournalLock


def _made_with(items: int = 4) -> dict[str, Any]:
    return fingerprint(default_pipeline(items=items))


def _finished(out: Path) -> tuple[RunDir, Path]:
    """A folder a run of 4 items finished, its one output ``meta/info.json``."""
    run = RunDir(out)
    run.prepare(_made_with(), fresh=False)
    run.release()
    info = out / "meta" / "info.json"
    info.parent.mkdir(parents=True)
    info.write_text('{"total_episodes": 4}', encoding="utf-8")
    summary = f"dataset: 4 episodes at {out}"
    run.mark_complete({"store": {"outputs": [str(info)], "root": str(out), "summary": summary}})
    return run, info


def test_a_finished_folder_mounted_read_only_answers_from_its_record(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run, _ = _finished(out)
    recorded = json.loads(run.record_path.read_text(encoding="utf-8"))["complete"]
    with read_only_mount(out):
        ro = RunDir(out)
        assert ro.answer_read_only(_made_with()) == recorded
        assert ro.in_use_problem() is None  # its lock cannot be opened for writing: not held
        ro.check(_made_with(), fresh=False)
        early = check_early(default_pipeline(items=4), out, None, None, fresh=False)
        assert early.finished and early.answer == recorded
        # Anything but that rerun is not answered: another pipeline, --fresh.
        assert ro.answer_read_only(_made_with(items=5)) is None
        assert check_early(default_pipeline(items=4), out, None, None, fresh=True).answer is None
        assert ro.lock is None


def test_a_writable_finished_folder_is_held_as_ever(tmp_path: Path) -> None:
    run, _ = _finished(tmp_path / "out")
    assert run.answer_read_only(_made_with()) is None  # a rerun takes its lock and answers then


def test_a_read_only_folder_not_finished_or_changed_since_is_not_answered(tmp_path: Path) -> None:
    unfinished = tmp_path / "unfinished"
    run = RunDir(unfinished)
    run.prepare(_made_with(), fresh=False)
    run.release()
    changed = tmp_path / "changed"
    _, info = _finished(changed)
    info.write_text('{"total_episodes": 3}', encoding="utf-8")  # one byte less: edited since
    for folder in (unfinished, changed):
        with read_only_mount(folder):
            assert RunDir(folder).answer_read_only(_made_with()) is None


def test_a_folder_finished_elsewhere_and_mounted_here_is_answered_under_its_new_name(tmp_path: Path) -> None:
    """The report's own: a finished --out bind-mounted read-only at another path."""
    golden = tmp_path / "o1.golden"
    _, info = _finished(golden)
    ro = tmp_path / "ro"
    with read_only_mount(golden, ro):
        answer = RunDir(ro).answer_read_only(_made_with())
        assert answer is not None
        here = str(ro / "meta" / "info.json")
        assert answer["out"] == str(ro)
        assert answer["finals"]["store"] == {
            "outputs": [here],
            "root": str(ro),
            "summary": f"dataset: 4 episodes at {ro}",
        }
        assert list(answer["stats"]) == [here]
    os.utime(info, ns=(0, 0))  # a copy that did not keep the times: nothing says it is the same
    with read_only_mount(golden, ro):
        assert RunDir(ro).answer_read_only(_made_with()) is None


def test_a_read_only_view_of_a_folder_a_run_holds_is_in_use(tmp_path: Path) -> None:
    """A run holding the folder where it can be written is seen from a read-only view of it,
    by a shared flock that writes nothing."""
    out = tmp_path / "out"
    run, _ = _finished(out)
    held = JournalLock.acquire(run.journal_path)
    try:
        with read_only_mount(out, tmp_path / "ro") as ro:
            problem = RunDir(ro).in_use_problem()
            assert problem is not None and f"is in use by another troupe run (pid {os.getpid()})" in problem
    finally:
        held.release()


def test_a_folder_is_renamed_only_where_it_is_named_whole(tmp_path: Path) -> None:
    complete = {
        "out": "/data/o1",
        "finals": {"s": {"summary": "at /data/o1; not /data/o10", "outputs": []}},
        "stats": {},
    }
    moved = tmp_path / "o1"
    moved.mkdir()
    found = found_here(complete, [], moved)
    assert found is not None
    assert found["finals"]["s"]["summary"] == f"at {moved}; not /data/o10"
