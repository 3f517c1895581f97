"""The train config: a TOML file loads; each bad field is one ConfigError naming it; {out}."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from troupe.actors.encoders.encoder_actor import DEFAULT_ENCODER
from troupe.actors.training.train_config import TrainConfig, load_train_config
from troupe.actors.training.trainer import lr_lambda, sample_seed
from troupe.runtime import ConfigError

LIGHT = "troupe.actors.encoders.light:LightEncoder"

TOML = """
[train]
dataset = "{out}"
steps = 20
batch_size = 4
clip_frames = 4
size = [32, 32]
lr = 1e-3
warmup_steps = 2
schedule = "constant"
checkpoint_every = 5
local_encoding = false

[model]
d_model = 32
layers = 2
heads = 2

[encoders]
count = 2
encoder = "troupe.actors.encoders.light:LightEncoder"
encoder_kwargs = { seed = 3 }
tags = ["encode"]

[trainers]
ranks = 2
threads = 1

[datagen]
pipeline = "datagen.toml"
items = 8
"""


def _valid() -> dict[str, Any]:
    return {
        "train": {"dataset": "{out}/data", "steps": 4, "clip_frames": 4, "size": [16, 16]},
        "model": {"d_model": 32, "layers": 1, "heads": 2},
        "encoders": {"encoder": LIGHT},
    }


def test_a_toml_file_loads_with_its_defaults_and_paths(tmp_path: Path) -> None:
    path = tmp_path / "train.toml"
    path.write_text(TOML)
    config = load_train_config(path)
    assert config.train.steps == 20 and config.train.size == (32, 32) and config.train.schedule == "constant"
    assert config.train.checkpoint_dir == "{out}/checkpoints" and config.train.keep_checkpoints == 3
    assert config.world_model().d_model == 32 and config.world_model().latent_channels == 4
    assert config.encoders.count == 2 and config.encoders.tags == ("encode",)
    assert config.trainers.ranks == 2 and config.trainers.threads == 1
    assert config.datagen is not None and config.datagen.pipeline == str(tmp_path / "datagen.toml")
    # JSON data (what the driver sends a rank) loads back to the same config.
    assert load_train_config(config.to_data()) == config


def test_out_is_substituted_in_every_path() -> None:
    data = _valid()
    data["encoders"] = {"encoder": LIGHT, "weights": "{out}/w.pt", "encoder_kwargs": {"note": "{out}/x"}}
    config = load_train_config(data).with_out("/runs/a")
    assert config.train.dataset == "/runs/a/data" and config.train.checkpoint_dir == "/runs/a/checkpoints"
    assert config.encoders.cache_dir == "/runs/a/latent-cache" and config.encoders.weights == "/runs/a/w.pt"
    assert config.encoders.encoder_kwargs == {"note": "/runs/a/x"}
    assert config.encoders.encoder == LIGHT and isinstance(config, TrainConfig)


def test_the_default_encoder_is_troupes_vae() -> None:
    data = _valid()
    del data["encoders"]
    data["encoders"] = {"encoder_kwargs": {"base_channels": 4}}
    assert load_train_config(data).encoders.encoder == DEFAULT_ENCODER


@pytest.mark.parametrize(
    ("section", "key", "value", "named"),
    [
        ("train", "steps", 0, "train.steps"),
        ("train", "steps", "3", "train.steps"),
        ("train", "batch_size", -1, "train.batch_size"),
        ("train", "schedule", "linear", "train.schedule"),
        ("train", "size", [16], "train.size"),
        ("train", "lr", 0, "train.lr"),
        ("train", "lr", 1e6, "train.lr"),
        ("train", "local_encoding", "yes", "train.local_encoding"),
        ("train", "bogus", 1, "train.bogus"),
        ("model", "d_model", 31, "d_model=31"),
        ("model", "dmodel", 32, "'dmodel' (did you mean 'd_model'?)"),
        ("encoders", "count", 0, "encoders.count"),
        ("encoders", "memory_mb", -1, "encoders.memory_mb"),
        ("encoders", "disk_mb", 0.01, "encoders.disk_mb: a disk tier of 0.01 MiB keeps nothing"),
        ("trainers", "ranks", 0, "trainers.ranks"),
        ("trainers", "threads", 0, "trainers.threads"),
    ],
)
def test_each_bad_field_is_one_error_naming_it(section: str, key: str, value: Any, named: str) -> None:
    data = _valid()
    data[section] = {**data.get(section, {}), key: value}
    with pytest.raises(ConfigError) as info:
        load_train_config(data)
    message = str(info.value)
    assert named in message and "\n" not in message


def test_missing_dataset_and_unknown_section_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train\.dataset"):
        load_train_config({"train": {"steps": 3}})
    path = tmp_path / "t.toml"
    path.write_text('[train]\ndataset = "d"\nsteps = 1\n[modle]\nd_model = 8\n')
    with pytest.raises(ConfigError, match=r"unknown sections: 'modle'.*did you mean \[model\]"):
        load_train_config(path)
    with pytest.raises(ConfigError, match="no such train file"):
        load_train_config(tmp_path / "absent.toml")


@pytest.mark.parametrize(
    ("model", "encoder_kwargs", "train", "named"),
    [
        ({"latent_channels": 8}, {}, {}, "model.latent_channels=8 but the encoder"),
        ({}, {"latent_channels": 6}, {}, "gives 6 latent channels"),
        ({}, {}, {"size": [18, 16]}, "train.size height=18"),
        ({"patch_size": 4}, {}, {"size": [24, 24]}, "model.patch_size (4)"),
        ({}, {}, {"clip_frames": 5}, "train.clip_frames=5"),
        ({"temporal_compression": 1}, {}, {}, "model.temporal_compression=1"),
    ],
)
def test_latents_that_cannot_fit_the_world_model_are_refused_before_start(
    model: dict[str, Any], encoder_kwargs: dict[str, Any], train: dict[str, Any], named: str
) -> None:
    data = _valid()
    data["model"] = {**data["model"], **model}
    data["encoders"] = {"encoder": LIGHT, "encoder_kwargs": encoder_kwargs}
    data["train"] = {**data["train"], **train}
    with pytest.raises(ConfigError, match=r"^train config: ") as info:
        load_train_config(data)
    assert named in str(info.value)


def test_the_vae_geometry_comes_from_its_config() -> None:
    data = _valid()
    data["encoders"] = {
        "encoder_kwargs": {"base_channels": 4, "latent_channels": 8, "spatial_compression": 8}
    }
    with pytest.raises(ConfigError, match="gives 8 latent channels"):
        load_train_config(data)
    data["model"] = {**data["model"], "latent_channels": 8, "patch_size": 1}
    data["train"] = {**data["train"], "size": [20, 16]}
    with pytest.raises(ConfigError, match=r"spatial compression \(8\)"):
        load_train_config(data)
    data["train"] = {**data["train"], "size": [16, 16]}
    assert load_train_config(data).world_model().latent_channels == 8


def test_the_lr_warms_up_then_follows_the_cosine_to_zero() -> None:
    data = _valid()
    data["train"] = {**data["train"], "steps": 10, "warmup_steps": 2}
    factor = lr_lambda(load_train_config(data))
    assert [factor(s) for s in (0, 1)] == [0.5, 1.0]
    assert factor(2) == 1.0 and 0 < factor(6) < 1 and factor(10) == 0.0
    data["train"] = {**data["train"], "schedule": "constant"}
    constant = lr_lambda(load_train_config(data))
    assert [constant(s) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]


def test_a_samples_noise_seed_depends_on_its_clip_and_step_only() -> None:
    assert sample_seed(3, 5, 7) == sample_seed(3, 5, 7)
    assert len({sample_seed(3, 5, 7), sample_seed(3, 5, 8), sample_seed(3, 6, 7), sample_seed(4, 5, 7)}) == 4


def test_vae_weights_that_are_missing_or_no_checkpoint_are_refused_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing file started the cluster and failed each encoder worker with a traceback; a
    damaged one was a traceback from the command itself."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trunc.pt").write_bytes(b"PK\x03\x04" + bytes(996))  # the start of a zip, cut
    data = _valid()
    for weights, said in (
        ("nope.pt", f"train config: encoders.weights = 'nope.pt': no such file (from {tmp_path})"),
        ("trunc.pt", "train config: encoders.weights = 'trunc.pt': not a checkpoint torch can read ("),
    ):
        data["encoders"] = {"weights": weights}
        with pytest.raises(ConfigError) as info:
            load_train_config(data)
        assert str(info.value).startswith(said), info.value


MISSPELT = (
    "train config: encoders.encoder_kwargs.sed: troupe's VAE encoder takes no argument 'sed' "
    "(did you mean 'seed'?); its arguments: weights, seed, in_channels,"
)


@pytest.mark.parametrize(
    ("encoders", "said"),
    [
        ({"encoder_kwargs": {"sed": 1}}, MISSPELT),
        ({"weights": "vae.pt", "encoder_kwargs": {"sed": 1}}, MISSPELT),
        (
            {"encoder_kwargs": {"seed": 1, "spatial_compression": 3}},
            "train config: encoders.encoder_kwargs: spatial_compression=3",
        ),
    ],
    ids=["misspelt", "misspelt-beside-weights", "bad-value"],
)
def test_vae_encoder_kwargs_it_does_not_take_are_refused_before_start(
    encoders: dict[str, Any], said: str
) -> None:
    """A misspelt name had started the cluster, then stopped each encoder actor as it started,
    the field unnamed; beside ``weights`` it was not even seen (the factory ignored it)."""
    data = _valid()
    data["encoders"] = encoders
    with pytest.raises(ConfigError) as info:
        load_train_config(data)
    assert str(info.value).startswith(said), info.value
