"""`train.dataset` that is no dataset: refused before anything starts, in one line whose way
out fits what the path is (a missing folder, a file, a training run's --out, some other folder).
The advice had been to run the data generation into the path, whatever it was."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from troupe.actors.training.train_prepare import check_dataset
from troupe.runtime.errors import ConfigError


def test_a_missing_folder_says_to_make_the_dataset_there(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"no dataset at .*; make one first: troupe run configs/datagen.toml --out"
    ):
        check_dataset(tmp_path / "nothing")


def test_the_command_it_suggests_quotes_a_path_with_a_space(tmp_path: Path) -> None:
    where = tmp_path / "my data"
    with pytest.raises(ConfigError) as err:
        check_dataset(where)
    suggested = str(err.value).partition("make one first: ")[2]
    assert shlex.split(suggested) == ["troupe", "run", "configs/datagen.toml", "--out", str(where)], suggested


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


@pytest.mark.parametrize("version", ["v2.1", "v2.0", None])
def test_a_lerobot_dataset_of_another_version_is_refused_naming_it(
    tmp_path: Path, version: str | None
) -> None:
    """A v2.1 dataset (episodes.jsonl, a parquet per episode) started the cluster, then failed
    as "rank 0: NotEnoughEpisodes: ... has 0 episodes"."""
    root = tmp_path / "v21"
    (root / "meta").mkdir(parents=True)
    info = {"fps": 10} if version is None else {"codebase_version": version, "fps": 10}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    found = "no codebase_version" if version is None else f"codebase_version {version}"
    with pytest.raises(ConfigError, match=rf"{found}.*troupe reads LeRobot v3\.0"):
        check_dataset(root)


def test_a_lerobot_v3_dataset_passes_and_an_unreadable_info_is_refused(tmp_path: Path) -> None:
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_text(json.dumps({"codebase_version": "v3.0"}))
    check_dataset(tmp_path)
    (tmp_path / "meta" / "info.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"meta/info\.json cannot be read"):
        check_dataset(tmp_path)
