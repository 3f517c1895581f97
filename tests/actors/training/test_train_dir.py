"""A training run's --out: refused while another run holds it, refused when its checkpoints were
made with another model, refused when it holds someone else's files; --fresh deletes only what
a training run wrote, and only in a folder one recorded (it had deleted a user's files in
checkpoints/ and logs/ of any folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from troupe.actors.training.train_dir import TrainDir
from troupe.runtime.errors import ConfigError

MADE: dict[str, Any] = {"model": {"d_model": 96}, "train": {"size": [32, 32], "clip_frames": 8}}


def _dir(out: Path) -> TrainDir:
    return TrainDir(out, [out / "checkpoints", out / "latent-cache", Path("/elsewhere/dataset")])


def test_a_new_folder_is_recorded_and_resumed_with_the_same_model(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _dir(out).prepare(MADE, fresh=False).release()
    (out / "checkpoints").mkdir()
    _dir(out).check(MADE, fresh=False)
    _dir(out).prepare(MADE, fresh=False).release()


def test_checkpoints_of_another_model_are_refused_naming_the_field(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _dir(out).prepare(MADE, fresh=False).release()
    other = {**MADE, "model": {"d_model": 64}}
    for refuse in (lambda: _dir(out).check(other, False), lambda: _dir(out).prepare(other, False)):
        with pytest.raises(ConfigError, match=r"with model\.d_model=96, this run asks model\.d_model=64"):
            refuse()
    _dir(out).prepare(other, fresh=True).release()  # --fresh starts anew with the new model
    _dir(out).check(other, fresh=False)


def test_a_folder_in_use_is_refused_naming_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    held = _dir(out).prepare(MADE, fresh=False)
    try:
        with pytest.raises(ConfigError, match=r"in use by another training run \(pid \d+\)"):
            _dir(out).check(MADE, fresh=False)
        with pytest.raises(ConfigError, match=r"in use by another training run"):
            _dir(out).prepare(MADE, fresh=True)
        assert (out / ".troupe-train" / "run.json").exists()  # the refused --fresh wiped nothing
    finally:
        held.release()
    _dir(out).prepare(MADE, fresh=False).release()


def test_fresh_in_a_folder_no_run_recorded_deletes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    (out / "checkpoints").mkdir(parents=True)
    (out / "logs").mkdir()
    (out / "checkpoints" / "important.txt").write_text("x")
    (out / "logs" / "mine.log").write_text("y")
    (out / "notes.txt").write_text("z")
    with pytest.raises(ConfigError, match=r"holds 'notes\.txt', which no training run wrote"):
        _dir(out).prepare(MADE, fresh=True)
    assert (out / "checkpoints" / "important.txt").read_text() == "x"
    assert (out / "logs" / "mine.log").read_text() == "y"
    (out / "notes.txt").unlink()
    # Only what a run writes: taken as an older troupe's run, and still nothing is deleted.
    _dir(out).prepare(MADE, fresh=True).release()
    assert (out / "checkpoints" / "important.txt").read_text() == "x"


def test_fresh_in_a_recorded_folder_deletes_what_a_run_wrote_only(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _dir(out).prepare(MADE, fresh=False).release()
    for name in ("checkpoints", "latent-cache", "logs", "latent-cache.damaged"):  # the last: set aside
        (out / name).mkdir()
        (out / name / "f").write_text("run")
    (out / "notes.txt").write_text("the user's")
    _dir(out).prepare(MADE, fresh=True).release()
    assert sorted(p.name for p in out.iterdir()) == [".troupe-train", "notes.txt"]
    assert (out / "notes.txt").read_text() == "the user's"


def test_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "afile"
    out.write_text("x")
    for refuse in (lambda: _dir(out).check(MADE, False), lambda: _dir(out).prepare(MADE, False)):
        with pytest.raises(ConfigError, match="is a file"):
            refuse()


def test_checkpoints_made_on_another_dataset_are_refused_and_a_record_without_one_resumes(
    tmp_path: Path,
) -> None:
    """Resumed on other data, a run failed three restarts later on a clip index out of range,
    or (on a bigger dataset) went on silently on other clips. A record from before runs kept
    the dataset has nothing to compare: it resumes as it did."""
    out = tmp_path / "out"
    made = {**MADE, "train": {**MADE["train"], "dataset": "/data/a"}}
    _dir(out).prepare(made, fresh=False).release()
    other = {**MADE, "train": {**MADE["train"], "dataset": "/data/b"}}
    with pytest.raises(
        ConfigError, match=r"with train\.dataset=/data/a, this run asks train\.dataset=/data/b"
    ):
        _dir(out).check(other, fresh=False)
    old = tmp_path / "old"
    _dir(old).prepare(MADE, fresh=False).release()  # no dataset recorded
    _dir(old).check(made, fresh=False)


def test_the_dataset_of_a_datagen_run_is_recorded_under_its_out(tmp_path: Path) -> None:
    """A run's own dataset ({out}/data) is recorded as such: the folder copied elsewhere resumes."""
    from types import SimpleNamespace

    from troupe.actors.training.train_dir import made_with

    def cfg(dataset: Path) -> Any:
        train = SimpleNamespace(size=(32, 32), clip_frames=8, dataset=str(dataset))
        encoders = SimpleNamespace(encoder="e", encoder_kwargs={}, weights=None)
        return SimpleNamespace(model={"d_model": 96}, train=train, encoders=encoders)

    here, there = tmp_path / "here", tmp_path / "there"
    assert made_with(cfg(here / "data"), here) == made_with(cfg(there / "data"), there)
    assert made_with(cfg(here / "data"), here)["train"]["dataset"] == "{out}/data"
    assert made_with(cfg(tmp_path / "given"), here)["train"]["dataset"] == str(tmp_path / "given")
