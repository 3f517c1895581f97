"""Training placed on a cluster by resource tags: two nodes joined to one master on loopback,
one tagged ``encoder`` and one ``trainer``; the encoder actors run on the first, the rank on the
second (the result's placement says so, and the run trains); a config whose tags no node offers
is refused before anything starts, naming the tags."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from support.chaos import TaskMaster
from support.clip_data import write_run
from support.tagged_nodes import tagged_nodes
from support.train_run_cli import config_copy
from troupe.actors.training.train_run import run_training
from troupe.runtime.errors import ConfigError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SUPERVISION = """
[supervision.kinds.trainer]
progress_timeout_s = 0.0
heartbeat_timeout_s = 30.0
"""


@pytest.fixture
def enc_and_trn(tmp_path: Path, master: TaskMaster) -> Iterator[None]:
    with tagged_nodes(
        master, tmp_path, {"enc": ("127.0.0.2", "encoder"), "trn": ("127.0.0.3", "trainer")}, SUPERVISION
    ):
        yield


def test_encoders_and_ranks_run_on_the_nodes_their_tags_name(
    tmp_path: Path, master: TaskMaster, enc_and_trn: None
) -> None:
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(4)})
    tags = {"encoders": {"tags": ["encoder"]}, "trainers": {"tags": ["trainer"]}}
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}, **tags})

    result = anyio.run(lambda: run_training(config, tmp_path / "out", steps=3, master=master.endpoint))
    assert result.placement == {"train-encode-0": "enc", "train-encode-1": "enc", "train-rank-0": "trn"}
    assert result.steps == 3 and len(result.losses) == 3
    assert all(n > 0 for n in result.requests.values()), result.requests

    nowhere = {"encoders": {"tags": ["gpu-box"]}}
    config = config_copy(tmp_path / "bad.toml", "train.toml", {"train": {"dataset": str(dataset)}, **nowhere})
    with pytest.raises(ConfigError, match=r"encoders: no node has tags \['gpu-box'\]"):
        anyio.run(lambda: run_training(config, tmp_path / "out2", steps=3, master=master.endpoint))
