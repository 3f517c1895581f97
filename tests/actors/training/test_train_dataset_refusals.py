"""`train.dataset` that is no dataset: refused before anything starts, in one line whose way
out fits what the path is (a missing folder, a file, a training run's --out, some other folder).
The advice had been to run the data generation into the path, whatever it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.actors.training.train_prepare import check_dataset
from troupe.runtime.errors import ConfigError


def test_a_missing_folder_says_to_make_the_dataset_there(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"no dataset at .*; make one first: troupe run configs/datagen.toml --out"
    ):
        check_dataset(tmp_path / "nothing")


def test_a_file_is_said_to_be_a_file(tmp_path: Path) -> None:
    (tmp_path / "train.toml").write_text("[train]\n")
    with pytest.raises(
        ConfigError, match=r"train\.toml is a file; give the folder of a LeRobot dataset"
    ) as err:
        check_dataset(tmp_path / "train.toml")
    assert "configs/datagen.toml" not in str(err.value)


def test_a_training_run_s_out_is_said_to_be_one(tmp_path: Path) -> None:
    (tmp_path / "run" / ".troupe-train").mkdir(parents=True)
    with pytest.raises(
        ConfigError, match=r"is a training run's --out, not a dataset; give the dataset it trained on"
    ):
        check_dataset(tmp_path / "run")


def test_another_folder_says_what_a_dataset_holds(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    with pytest.raises(ConfigError, match=r"is not a LeRobot dataset nor a troupe run's folder"):
        check_dataset(tmp_path / "photos")
