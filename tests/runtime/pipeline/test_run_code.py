"""Which troupe code made a run folder's outputs: kept in its record (``made_by``), and said in
one line where a run of other code goes on there (report up 5: a folder an older troupe began
and today's resumed mixed two encoders' episodes without a word). In memory and on tmp_path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from troupe.actors.datagen.config import default_pipeline
from troupe.actors.training.train_dir import TrainDir
from troupe.runtime.pipeline.run_code import UNRECORDED, this_code
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.pipeline.run_fingerprint import fingerprint
from troupe.runtime.pipeline.run_plan import plan_run

OLDER = {"version": "0.0.9", "digest": "0123abcd"}


def _made_with() -> dict[str, Any]:
    return fingerprint(default_pipeline(items=4))


def _record(run: RunDir) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(run.record_path.read_text(encoding="utf-8"))
    return record


def _edit(run: RunDir, **fields: Any) -> None:
    run.record_path.write_text(json.dumps({**_record(run), **fields}), encoding="utf-8")


def _begun(out: Path) -> RunDir:
    run = RunDir(out)
    run.prepare(_made_with(), fresh=False)
    run.release()
    return run


def test_a_new_folder_records_its_code_once_a_run_may_have_made_something(tmp_path: Path) -> None:
    """The record of a folder just begun names no code (nothing is made there yet: a run of
    other code after one stopped at once has nothing to mix with); its copy keeps the code that
    began it; the run's note records it, once."""
    run = _begun(tmp_path / "out")
    now = this_code()
    assert now["digest"] and now["version"]
    assert _record(run)["made_by"] == []
    assert json.loads(run.copy_path.read_text(encoding="utf-8"))["made_by"] == [now]
    _edit(run, made_by=[])
    assert run.check_code() is None and run.other_code is None  # nothing there to mix with
    run.note_code()
    assert _record(run)["made_by"] == [now]
    run.note_code()
    assert _record(run)["made_by"] == [now]  # never the same code twice as the last entry
    assert run.check_code() is None  # the same code goes on: no word


def test_a_folder_another_code_made_is_said_and_recorded_once_this_one_may_make(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = _begun(out)
    _edit(run, made_by=[OLDER])
    line = run.check_code()
    now = this_code()
    assert line is not None and run.other_code == line and "\n" not in line
    assert line.startswith(f"--out {out} was made by troupe 0.0.9 (code 0123abcd); ")
    assert f"this is troupe {now['version']} (code {now['digest']})" in line
    assert "what this run makes there will be this code's" in line and "--fresh" in line
    assert _record(run)["made_by"] == [OLDER]  # said, not recorded: nothing is made yet
    assert RunDir(out).check_code() == line  # a run stopped before it made anything: said again
    run.note_code()
    assert _record(run)["made_by"] == [OLDER, now]
    assert RunDir(out).check_code() is None  # this code made something there last now
    RunDir(out).note_code()
    assert _record(run)["made_by"] == [OLDER, now]


def test_a_record_of_a_troupe_that_kept_no_code_is_said_as_such(tmp_path: Path) -> None:
    run = _begun(tmp_path / "out")
    record = _record(run)
    del record["made_by"]
    run.record_path.write_text(json.dumps(record), encoding="utf-8")
    line = run.check_code()
    assert line is not None and "was made by a troupe that did not record its code; this is troupe" in line
    run.note_code()
    assert _record(run)["made_by"] == [UNRECORDED, this_code()]


def test_a_resume_under_other_code_is_said_by_the_plan_and_a_finished_folder_is_left_alone(
    tmp_path: Path,
) -> None:
    """The plan of a run that will make or finalise something says the line and records
    nothing (the run does, once it may have made something); a rerun of a finished run writes
    nothing and says nothing."""
    out = tmp_path / "out"
    run = _begun(out)
    _edit(run, made_by=[OLDER])
    before = run.record_path.read_bytes()
    plan = plan_run(default_pipeline(items=4), out, None, fresh=False)
    assert plan.run_dir is not None and plan.complete is None
    plan.run_dir.release()
    assert plan.run_dir.other_code is not None and "troupe 0.0.9 (code 0123abcd)" in plan.run_dir.other_code
    assert run.record_path.read_bytes() == before
    made = out / "made.bin"
    made.write_bytes(b"x")
    RunDir(out).mark_complete({"store": {"outputs": [str(made)]}})
    before = run.record_path.read_bytes()
    finished = plan_run(default_pipeline(items=4), out, None, fresh=False)
    assert finished.run_dir is not None and finished.complete is not None
    finished.run_dir.release()
    assert finished.run_dir.other_code is None
    assert run.record_path.read_bytes() == before


def test_a_record_rebuilt_from_its_copy_keeps_the_code_that_began_it(tmp_path: Path) -> None:
    run = _begun(tmp_path / "out")
    copy = json.loads(run.copy_path.read_text(encoding="utf-8"))
    run.copy_path.write_text(json.dumps({**copy, "made_by": [OLDER]}), encoding="utf-8")
    run.record_path.unlink()
    again = RunDir(tmp_path / "out")
    again.prepare(_made_with(), fresh=False)
    again.release()
    assert again.recovered == "missing"
    assert again.check_code() is not None
    again.note_code()
    assert _record(again)["made_by"] == [OLDER, this_code()]


MADE: dict[str, Any] = {"model": {"d_model": 96}, "train": {"size": [32, 32], "clip_frames": 8}}


def _train_dir(out: Path) -> TrainDir:
    return TrainDir(out, [out / "checkpoints"])


def test_a_training_resumed_under_other_code_says_so_and_records_both(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _train_dir(out).prepare(MADE, fresh=False).release()
    record_path = out / ".troupe-train" / "run.json"
    assert json.loads(record_path.read_text(encoding="utf-8"))["made_by"] == [this_code()]
    (out / "checkpoints" / "step-000000001").mkdir(parents=True)  # something to resume
    record = json.loads(record_path.read_text(encoding="utf-8"))
    record_path.write_text(json.dumps({**record, "made_by": [OLDER]}), encoding="utf-8")
    folder = _train_dir(out)
    folder.prepare(MADE, fresh=False).release()
    assert folder.other_code is not None
    assert folder.other_code.startswith(f"--out {out} was made by troupe 0.0.9 (code 0123abcd); ")
    assert "the steps this run trains will be this code's" in folder.other_code
    assert json.loads(record_path.read_text(encoding="utf-8"))["made_by"] == [OLDER, this_code()]
    again = _train_dir(out)
    again.prepare(MADE, fresh=False).release()
    assert again.other_code is None
