"""A training config whose world model cannot fit in memory is refused before anything starts:
``d_model = 8192, layers = 64`` was taken, and its rank grew to 14 GB on a 24 GB machine with
no word before the host neared its OOM killer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from support.clip_data import write_run
from support.train_run_cli import config_copy
from troupe.cli.commands.model_memory import world_model_bytes, world_model_problem
from troupe.cli.commands.run_train import check_train
from troupe.cli.commands.vae_checks import device_memory
from troupe.models.world_model import WorldModelConfig
from troupe.runtime.errors import ConfigError


def _cfg(**model: int) -> SimpleNamespace:
    return SimpleNamespace(world_model=lambda: WorldModelConfig(**model))


def test_a_model_past_the_device_s_memory_is_refused_naming_it() -> None:
    said = world_model_problem(_cfg(d_model=8192, layers=64, heads=8))
    have, where = device_memory()
    assert said is not None, (world_model_bytes(_cfg(d_model=8192, layers=64, heads=8)), have)
    assert said.startswith("[model] d_model = 8192, layers = 64: a rank's weights, gradients and optimizer")
    assert f"GiB of {where}; make [model] smaller" in said


def test_the_shipped_model_passes() -> None:
    assert world_model_problem(_cfg(d_model=96, layers=3, heads=4)) is None
    # 16 bytes a parameter: a lower bound, which a small model is far above zero of
    assert 16 * 100_000 < world_model_bytes(_cfg(d_model=96, layers=3, heads=4)) < 1 << 30


def test_troupe_run_refuses_it_before_anything_starts(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(2)})
    big = {"train": {"dataset": str(dataset)}, "model": {"d_model": 8192, "layers": 64, "heads": 8}}
    config = config_copy(tmp_path / "big.toml", "train.toml", big)
    with pytest.raises(ConfigError, match=r"\[model\] d_model = 8192, layers = 64: "):
        check_train(config, tmp_path / "out", steps=5, items=None)
    assert not (tmp_path / "out").exists()
