"""A training run's data generation checked before anything starts: items below
``train.min_episodes``, and a dataset folder an earlier run made with other items. The latter
had been found once the cluster was up, naming ``--out/data`` (a path the user never gave) and
``--fresh`` alone (which deletes the checkpoints and the latent cache too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.train_run_cli import CONFIGS, config_copy, datagen_made
from troupe.actors.training.train_config import load_train_config
from troupe.actors.training.train_prepare import check_datagen
from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline.config import load_pipeline
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.pipeline.run_fingerprint import fingerprint


def _config(tmp_path: Path, out: Path, items: int | None = None, **train: int) -> object:
    changes = {"train": dict(train), **({"datagen": {"items": items}} if items else {})}
    config = load_train_config(config_copy(tmp_path / "dt.toml", "datagen-train.toml", changes))
    return config.with_out(out)


def test_a_data_generation_made_with_other_items_names_the_out_and_both_ways(tmp_path: Path) -> None:
    out = tmp_path / "dt-out"
    datagen_made(out / "data", 6)
    with pytest.raises(ConfigError) as err:
        check_datagen(_config(tmp_path, out), out, fresh=False)
    said = str(err.value)
    assert f"--out {out} holds a data generation made with items=6, this run asks items=16" in said
    assert "--items 6" in said and "--fresh" in said and "checkpoints" in said, said
    assert f"{out}/data" not in said, said
    check_datagen(_config(tmp_path, out, items=6), out, fresh=False)  # the way out it names
    check_datagen(_config(tmp_path, out), out, fresh=True)  # the other


def test_a_data_generation_that_made_nothing_binds_nothing(tmp_path: Path) -> None:
    out = tmp_path / "dt-out"
    pipeline = load_pipeline(CONFIGS / "datagen.toml", items=6)
    RunDir(out / "data").prepare(fingerprint(pipeline), fresh=False)
    check_datagen(_config(tmp_path, out), out, fresh=False)


def test_fewer_items_than_min_episodes_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "dt-out"
    with pytest.raises(
        ConfigError, match=r"makes 2 episode\(s\) at most .* fewer than train\.min_episodes = 4"
    ):
        check_datagen(_config(tmp_path, out, items=2), out, fresh=False)
    assert not out.exists()
