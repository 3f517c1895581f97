"""A training run's --out: refused while another run holds it, refused when its checkpoints were
made with another model, refused when it holds someone else's files; --fresh deletes only what
a training run wrote, and only in a folder one recorded (it had deleted a user's files in
checkpoints/ and logs/ of any folder)."""

from __future__ import annotations

import json
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
    _step(out / "checkpoints", 1)
    other = {**MADE, "model": {"d_model": 64}}
    for refuse in (lambda: _dir(out).check(other, False), lambda: _dir(out).prepare(other, False)):
        with pytest.raises(ConfigError, match=r"with model\.d_model=96, this run builds model\.d_model=64"):
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


@pytest.mark.parametrize("damage", ["{garbage", "[]"])
def test_fresh_wipes_a_folder_whose_record_is_damaged(tmp_path: Path, damage: str) -> None:
    """The damaged record's refusal says "or use --fresh to start anew": --fresh was refused with
    the same line, as the wipe read the record first."""
    out = tmp_path / "out"
    _dir(out).prepare(MADE, fresh=False).release()
    (out / "checkpoints" / "step-000000010").mkdir(parents=True)
    (out / ".troupe-train" / "run.json").write_text(damage)
    with pytest.raises(ConfigError, match="use --fresh to start anew"):
        _dir(out).prepare(MADE, fresh=False)
    _dir(out).check(MADE, fresh=True)
    _dir(out).prepare(MADE, fresh=True).release()
    assert sorted(p.name for p in out.iterdir()) == [".troupe-train"]
    assert json.loads((out / ".troupe-train" / "run.json").read_text())["made_with"] == MADE


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
    _step(out / "checkpoints", 1)
    other = {**MADE, "train": {**MADE["train"], "dataset": "/data/b"}}
    with pytest.raises(
        ConfigError, match=r"with train\.dataset=/data/a, this run asks train\.dataset=/data/b"
    ):
        _dir(out).check(other, fresh=False)
    old = tmp_path / "old"
    _dir(old).prepare(MADE, fresh=False).release()  # no dataset recorded
    _step(old / "checkpoints", 1)
    _dir(old).check(made, fresh=False)


def test_the_dataset_of_a_datagen_run_is_recorded_under_its_out(tmp_path: Path) -> None:
    """A run's own dataset ({out}/data) is recorded as such: the folder copied elsewhere resumes."""
    from types import SimpleNamespace

    from troupe.actors.training.train_dir import made_with

    def cfg(dataset: Path) -> Any:
        train = SimpleNamespace(size=(32, 32), clip_frames=8, dataset=str(dataset), seed=0)
        encoders = SimpleNamespace(encoder="e", encoder_kwargs={}, weights=None)
        return SimpleNamespace(model={"d_model": 96}, train=train, encoders=encoders)

    here, there = tmp_path / "here", tmp_path / "there"
    assert made_with(cfg(here / "data"), here) == made_with(cfg(there / "data"), there)
    assert made_with(cfg(here / "data"), here)["train"]["dataset"] == "{out}/data"
    assert made_with(cfg(tmp_path / "given"), here)["train"]["dataset"] == str(tmp_path / "given")


def _outside(out: Path, checkpoints: Path) -> TrainDir:
    return TrainDir(out, [checkpoints, out / "latent-cache"], checkpoints)


def _step(checkpoints: Path, step: int) -> Path:
    folder = checkpoints / f"step-{step:09d}"
    folder.mkdir(parents=True)
    (folder / "COMMITTED").write_text(f"{step}\n")
    return folder


def test_a_checkpoint_dir_outside_out_is_bound_to_the_out_that_made_it(tmp_path: Path) -> None:
    """A second --out naming the same train.checkpoint_dir resumed from the first's checkpoints,
    silently, and wrote its own over them."""
    a, b, mine = tmp_path / "a", tmp_path / "b", tmp_path / "userdir"
    _outside(a, mine).prepare(MADE, fresh=False).release()
    _step(mine, 3)
    both = rf"train\.checkpoint_dir {mine} holds the checkpoints of --out {a}, not of --out {b}"
    for fresh in (False, True):
        with pytest.raises(ConfigError, match=both):
            _outside(b, mine).check(MADE, fresh)
        with pytest.raises(ConfigError, match=both):
            _outside(b, mine).prepare(MADE, fresh)
    assert (mine / "step-000000003").is_dir() and not (b / ".troupe-train" / "run.json").exists()
    _outside(a, mine).check(MADE, fresh=False)  # its own --out resumes
    _outside(a, mine).prepare(MADE, fresh=False).release()
    assert json.loads((a / ".troupe-train" / "run.json").read_text())["checkpoint_dirs"] == [str(mine)]


def test_fresh_deletes_the_steps_of_a_checkpoint_dir_outside_out_and_nothing_else(tmp_path: Path) -> None:
    """--fresh left them there: the run said "resuming from step 3" and trained nothing."""
    out, mine = tmp_path / "out", tmp_path / "userdir"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    (mine / "step-notes").mkdir()
    _outside(out, mine).prepare(MADE, fresh=False).release()
    _step(mine, 3)
    _outside(out, mine).prepare(MADE, fresh=True).release()
    assert sorted(p.name for p in mine.iterdir()) == [".troupe-train-out.json", "notes.txt", "step-notes"]
    with pytest.raises(ConfigError, match=rf"holds the checkpoints of --out {out}"):
        _outside(tmp_path / "other", mine).check(MADE, fresh=False)  # still this --out's


def test_checkpoints_no_run_of_this_out_made_are_refused(tmp_path: Path) -> None:
    out, mine = tmp_path / "out", tmp_path / "userdir"
    _step(mine, 7)
    for fresh in (False, True):
        with pytest.raises(
            ConfigError, match=r"holds checkpoints no run of --out .* made \(step-000000007\)"
        ):
            _outside(out, mine).prepare(MADE, fresh)
    assert (mine / "step-000000007").is_dir()


def test_fresh_through_prepare_run_deletes_the_checkpoints_of_a_dir_outside_out(tmp_path: Path) -> None:
    """The config's checkpoint_dir reaches the folder's rules (troupe run TRAIN.toml --fresh)."""
    from trainer_testdata import train_data

    from troupe.actors.training.train_prepare import prepare_run

    dataset, mine = tmp_path / "data", tmp_path / "userdir"
    (dataset / ".troupe" / "episodes").mkdir(parents=True)
    config = train_data(dataset, 3, checkpoint_dir=str(mine))
    prepare_run(config, tmp_path / "a", None, fresh=False)[2].release()
    _step(mine, 3)
    with pytest.raises(ConfigError, match=rf"holds the checkpoints of --out {tmp_path / 'a'}, not of --out"):
        prepare_run(config, tmp_path / "b", None, fresh=False)
    prepare_run(config, tmp_path / "a", None, fresh=True)[2].release()
    assert not (mine / "step-000000003").exists()


def test_a_pipeline_run_s_folder_is_named_so(tmp_path: Path) -> None:
    """Not "holds '.troupe', which no training run wrote": a troupe pipeline run wrote it."""
    out = tmp_path / "out"
    (out / ".troupe").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"is a pipeline run's folder \(it holds '\.troupe'\)"):
        _dir(out).prepare(MADE, fresh=False)


def test_another_weights_file_at_the_same_path_is_another_encoder(tmp_path: Path) -> None:
    """The encoder's weights replaced in place (`train-vae --force` to the same path): the run's
    checkpoints were trained on the other encoder's latents, so resuming is refused, naming the
    weights' sha256 (it had resumed silently). A record from before the sha256 was kept resumes."""
    from types import SimpleNamespace

    from troupe.actors.training.train_dir import made_with

    weights = tmp_path / "vae.pt"
    weights.write_bytes(b"weights one")
    train = SimpleNamespace(size=(32, 32), clip_frames=8, dataset=str(tmp_path / "data"), seed=0)
    encoders = SimpleNamespace(encoder="e", encoder_kwargs={}, weights=str(weights))
    cfg = SimpleNamespace(model={"d_model": 96}, train=train, encoders=encoders)
    out = tmp_path / "out"
    _dir(out).prepare(made_with(cfg, out), fresh=False).release()
    _step(out / "checkpoints", 1)
    _dir(out).check(made_with(cfg, out), fresh=False)
    weights.write_bytes(b"weights two")
    with pytest.raises(ConfigError, match=r"made with encoder\.weights_sha256=[0-9a-f]{64}, this run asks"):
        _dir(out).check(made_with(cfg, out), fresh=False)

    old = tmp_path / "old"
    recorded = made_with(cfg, old)
    del recorded["encoder"]["weights_sha256"]
    _dir(old).prepare(recorded, fresh=False).release()
    _step(old / "checkpoints", 1)
    _dir(old).check(made_with(cfg, old), fresh=False)


def test_a_config_without_size_is_recorded_and_resumed(tmp_path: Path) -> None:
    """`train.size` left out (frames at their stored size) crashed the record with a TypeError
    before anything started; it is recorded as such, and the same config resumes."""
    from trainer_testdata import train_data

    from troupe.actors.training.train_prepare import prepare_run

    dataset, out = tmp_path / "data", tmp_path / "out"
    (dataset / ".troupe" / "episodes").mkdir(parents=True)
    config = train_data(dataset, 3, size=None)
    prepare_run(config, out, None, fresh=False)[2].release()
    assert json.loads((out / ".troupe-train" / "run.json").read_text())["made_with"]["train"]["size"] is None
    prepare_run(config, out, None, fresh=False)[2].release()


def test_a_run_that_committed_no_checkpoint_binds_nothing(tmp_path: Path) -> None:
    """A first run that failed before any checkpoint (a dataset of the wrong version, say) left
    its record, and the rerun on the right dataset was refused as "holds checkpoints made with
    train.dataset=..." though none existed: the new config is taken, and binds once it writes
    a checkpoint."""
    out = tmp_path / "out"
    made = {**MADE, "train": {**MADE["train"], "dataset": "/data/a"}}
    other = {**MADE, "train": {**MADE["train"], "dataset": "/data/b"}}
    _dir(out).prepare(made, fresh=False).release()
    (out / "checkpoints").mkdir()
    _dir(out).check(other, fresh=False)
    _dir(out).prepare(other, fresh=False).release()
    assert json.loads((out / ".troupe-train" / "run.json").read_text())["made_with"] == other
    _step(out / "checkpoints", 2)
    with pytest.raises(
        ConfigError, match=r"with train\.dataset=/data/b, this run asks train\.dataset=/data/a"
    ):
        _dir(out).prepare(made, fresh=False)


def test_a_foreign_file_s_refusal_lists_what_a_user_knows_a_run_writes(tmp_path: Path) -> None:
    """It listed troupe's internal twins too (".troupe-train.damaged, checkpoints.damaged, ...")."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as err:
        _dir(out).check(MADE, fresh=False)
    assert str(err.value).endswith("(a run writes .troupe-train, checkpoints, latent-cache, logs there)")


def test_prepare_run_refuses_a_cache_dir_that_is_the_checkpoint_dir(tmp_path: Path) -> None:
    """From Python too (report lc 7), before anything is made in --out."""
    from trainer_testdata import train_data

    from troupe.actors.training.train_prepare import prepare_run

    dataset, out = tmp_path / "data", tmp_path / "out"
    (dataset / ".troupe" / "episodes").mkdir(parents=True)
    config = train_data(dataset, 3)
    config["encoders"] |= {"cache_dir": "{out}/checkpoints", "disk_mb": 8.0}
    with pytest.raises(
        ConfigError, match=r"encoders\.cache_dir .*/out/checkpoints is the run's train\.checkpoint_dir"
    ):
        prepare_run(config, out, None, fresh=False)
    assert not out.exists()
    config["encoders"]["cache_dir"] = "{out}/latent-cache"  # its place
    prepare_run(config, out, None, fresh=False)[2].release()
