"""Checkpoints made with another model than this troupe builds from the same ``[model]`` (another
version changed a ``WorldModelConfig`` default): refused before anything starts, naming the field
and the ways on (report lc 3). The record kept only the keys ``[model]`` set, so the change was
found as rank 0 loaded the checkpoint, called unloadable with advice to move it away, which no
checkpoint could follow: every one was the other model's. A record of that kind still resumes.

And a run that committed no checkpoint takes its code back from ``made_by`` as it ends: a run
under other code that failed before its first (on a checkpoint it could not load, say) had the
folder said to mix both codes for ever.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from troupe.actors.training import train_dir
from troupe.actors.training.train_dir import TrainDir, made_with
from troupe.models.world_model import WorldModelConfig
from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline.run_code import this_code

OLDER = {"version": "0.0.9", "digest": "0123abcd"}


@dataclasses.dataclass(frozen=True)
class _OtherDefaults(WorldModelConfig):
    """The world model of a troupe whose ``mlp_ratio`` default is 2.0."""

    mlp_ratio: float = 2.0


def _cfg(**model: Any) -> Any:
    train = SimpleNamespace(size=(32, 32), clip_frames=8, dataset="/data/a", seed=0)
    encoders = SimpleNamespace(encoder="e", encoder_kwargs={}, weights=None)
    return SimpleNamespace(model={"d_model": 96, **model}, train=train, encoders=encoders)


def _dir(out: Path) -> TrainDir:
    return TrainDir(out, [out / "checkpoints", out / "latent-cache"])


def _step(out: Path, step: int, committed: bool = True) -> Path:
    folder = out / "checkpoints" / f"step-{step:09d}"
    folder.mkdir(parents=True, exist_ok=True)
    if committed:
        (folder / "COMMITTED").write_text(f"{step}\n")
    return folder


def _record(out: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((out / ".troupe-train" / "run.json").read_text())
    return record


def _rewrite(out: Path, **changes: Any) -> None:
    (out / ".troupe-train" / "run.json").write_text(json.dumps({**_record(out), **changes}))


def test_the_record_holds_every_field_of_the_model_defaults_included(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _dir(out).prepare(made_with(_cfg(), out), fresh=False).release()
    recorded = _record(out)["made_with"]["model"]
    assert recorded == dataclasses.asdict(WorldModelConfig(d_model=96))
    assert recorded["mlp_ratio"] == 4.0  # not written in [model]: this troupe's default


def test_a_default_another_troupe_changed_is_refused_up_front_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    _dir(out).prepare(made_with(_cfg(), out), fresh=False).release()
    _step(out, 5)
    _rewrite(out, made_by=[OLDER])
    monkeypatch.setattr(train_dir, "WorldModelConfig", _OtherDefaults)  # the upgrade
    made = made_with(_cfg(), out)
    said = (
        f"--out {out} holds checkpoints made with model.mlp_ratio=4.0, this run builds "
        "model.mlp_ratio=2.0 (its [model] with this troupe's defaults): they cannot be resumed (set "
        "mlp_ratio = 4.0 in [model] to resume them, run troupe 0.0.9 (code 0123abcd), which made "
        "them, use --fresh to start anew, or another --out)"
    )
    for refuse in (lambda: _dir(out).check(made, False), lambda: _dir(out).prepare(made, False)):
        with pytest.raises(ConfigError) as err:
            refuse()
        assert str(err.value) == said
    assert _record(out)["made_by"] == [OLDER]  # refused: nothing recorded
    _dir(out).check(made_with(_cfg(mlp_ratio=4.0), out), fresh=False)  # the way it names resumes


def test_a_record_of_the_keys_model_set_only_still_resumes(tmp_path: Path) -> None:
    """As a troupe before the resolved model was recorded left it: completed with this code's
    defaults, so a field it left out is compared with the default, and a default written out
    now is the same model."""
    out = tmp_path / "out"
    _dir(out).prepare(made_with(_cfg(), out), fresh=False).release()
    _step(out, 5)
    _rewrite(out, made_with={**_record(out)["made_with"], "model": {"d_model": 96}})
    _dir(out).check(made_with(_cfg(), out), fresh=False)
    _dir(out).check(made_with(_cfg(mlp_ratio=4.0, layers=4), out), fresh=False)  # the defaults
    with pytest.raises(ConfigError, match=r"made with model\.layers=4, this run builds model\.layers=2 "):
        _dir(out).check(made_with(_cfg(layers=2), out), fresh=False)
    _dir(out).prepare(made_with(_cfg(), out), fresh=False).release()
    assert _record(out)["made_with"]["model"] == {"d_model": 96}  # kept as it was


def test_a_field_this_troupe_has_not_is_refused_without_setting_it(tmp_path: Path) -> None:
    """A record of a troupe whose model had a field this one lacks: no [model] key to set."""
    out = tmp_path / "out"
    _dir(out).prepare(made_with(_cfg(), out), fresh=False).release()
    _step(out, 5)
    recorded = _record(out)["made_with"]
    _rewrite(out, made_with={**recorded, "model": {**recorded["model"], "dropout": 0.1}})
    with pytest.raises(ConfigError) as err:
        _dir(out).check(made_with(_cfg(), out), fresh=False)
    assert "made with model.dropout=0.1, this run builds no model.dropout" in str(err.value)
    assert "set dropout" not in str(err.value)


def test_a_run_that_committed_no_checkpoint_takes_its_code_back(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _dir(out).prepare(made_with(_cfg(), out), fresh=False).release()
    _step(out, 5)
    _step(out, 10, committed=False)  # a save killed as it wrote
    _rewrite(out, made_by=[OLDER])
    failed = _dir(out)
    failed.prepare(made_with(_cfg(), out), fresh=False)
    assert _record(out)["made_by"] == [OLDER, this_code()]  # before it may make anything
    failed.release()  # it failed, say, loading step 5
    assert _record(out)["made_by"] == [OLDER]

    trained = _dir(out)
    trained.prepare(made_with(_cfg(), out), fresh=False)
    (_step(out, 10, committed=False) / "COMMITTED").write_text("10\n")  # saved again, committed
    trained.release()
    assert _record(out)["made_by"] == [OLDER, this_code()]
    again = _dir(out)
    again.prepare(made_with(_cfg(), out), fresh=False)
    again.release()  # this code was the last already: nothing to take back
    assert _record(out)["made_by"] == [OLDER, this_code()]


def test_a_record_without_made_by_is_put_back_without_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _dir(out).prepare(made_with(_cfg(), out), fresh=False).release()
    _step(out, 5)
    record = _record(out)
    del record["made_by"]  # an older troupe's
    (out / ".troupe-train" / "run.json").write_text(json.dumps(record))
    folder = _dir(out)
    folder.prepare(made_with(_cfg(), out), fresh=False)
    folder.release()
    assert "made_by" not in _record(out)


def test_a_new_folder_that_got_no_checkpoint_records_no_code(tmp_path: Path) -> None:
    out = tmp_path / "out"
    folder = _dir(out)
    folder.prepare(made_with(_cfg(), out), fresh=False)
    assert _record(out)["made_by"] == [this_code()]
    folder.release()
    assert _record(out)["made_by"] == []  # nothing made there yet
    folder.release()  # a second release does nothing
    with_one = _dir(out)
    with_one.prepare(made_with(_cfg(), out), fresh=False)
    _step(out, 2)
    with_one.release()
    assert _record(out)["made_by"] == [this_code()]
