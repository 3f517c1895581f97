"""Training run declarations: one TOML file, validated once, with the pipeline config's errors.

::

    [train]
    dataset = "{out}"            # a LeRobot dataset, or a troupe run's output folder
    steps = 1000
    batch_size = 8
    clip_frames = 8
    size = [64, 64]              # frames resized to H x W (optional: kept as recorded)
    lr = 3e-4
    warmup_steps = 50
    schedule = "cosine"          # or "constant"
    seed = 0
    inflight = 2                 # K batches in flight per rank
    group_size = 2               # samples per group sent to one encoder actor
    checkpoint_every = 100       # steps; 0: only the final step
    local_encoding = false       # true: encode inside the trainer, no encoder actors

    [model]                      # WorldModelConfig fields
    d_model = 128
    layers = 4

    [encoders]
    count = 2
    memory_mb = 256
    disk_mb = 1024
    inline_below_ms = 50         # shorter encodes run on the actor's event loop; 0: on a thread

    [trainers]
    ranks = 1

    [datagen]                    # optional: generation runs beside training
    pipeline = "datagen.toml"    # relative to this file's folder
    items = 64

``{out}`` in a path stands for the run's output folder (:meth:`TrainConfig.with_out`). Unknown
keys are refused; counts are strict integers. Where the encoder is troupe's VAE or the light test
encoder, the latents' geometry is checked against the world model before anything starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, StrictBool, StrictFloat, StrictInt, ValidationError, field_validator

from troupe.actors.encoders.encoder_actor import DEFAULT_ENCODER
from troupe.actors.encoders.latent_cache import disk_bound_problem
from troupe.models.world_model import WorldModelConfig
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import _Frozen, read_toml, validation_message

__all__ = [
    "DEFAULT_DATASET_CLASS",
    "DatagenSection",
    "EncodersSection",
    "TrainConfig",
    "TrainSection",
    "TrainersSection",
    "check_geometry",
    "encoder_geometry",
    "load_train_config",
]

DEFAULT_DATASET_CLASS = "troupe.actors.training.dataset:LeRobotClips"
LIGHT_ENCODER = "troupe.actors.encoders.light:LightEncoder"
_SECTIONS = {"train", "model", "encoders", "trainers", "datagen"}
_EXPECTED = "[train], [model], [encoders], [trainers] and [datagen]"


class TrainSection(_Frozen):
    """What one rank trains on, for how long, and how."""

    dataset: str = Field(min_length=1)
    dataset_class: str = Field(default=DEFAULT_DATASET_CLASS, min_length=3)
    steps: StrictInt = Field(gt=0)
    batch_size: StrictInt = Field(default=8, ge=1)
    clip_frames: StrictInt = Field(default=8, ge=1)
    action_steps: StrictInt | None = Field(default=None, ge=1)
    size: tuple[StrictInt, StrictInt] | None = None
    stride: StrictInt | None = Field(default=None, ge=1)
    lr: StrictFloat = Field(default=3e-4, gt=0, le=10.0)  # above: divergence only (as train-vae's --lr)
    weight_decay: StrictFloat = Field(default=0.01, ge=0)
    warmup_steps: StrictInt = Field(default=0, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    seed: StrictInt = Field(default=0, ge=0, le=2**31 - 1)
    inflight: StrictInt = Field(default=2, ge=1, le=64)
    group_size: StrictInt = Field(default=2, ge=1)
    deadline_s: StrictFloat = Field(default=60.0, gt=0)
    checkpoint_every: StrictInt = Field(default=100, ge=0)
    checkpoint_dir: str = Field(default="{out}/checkpoints", min_length=1)
    keep_checkpoints: StrictInt = Field(default=3, ge=1)
    local_encoding: StrictBool = False
    min_episodes: StrictInt = Field(default=1, ge=1)
    num_workers: StrictInt = Field(default=0, ge=0)
    max_restarts: StrictInt = Field(default=3, ge=0)

    @field_validator("size")
    @classmethod
    def _positive_size(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and min(value) < 1:
            raise ValueError(f"expected [H, W] of positive integers, got {list(value)}")
        return value


class EncodersSection(_Frozen):
    """The encoder actors: how many, which encoder, their latent cache and where they run."""

    count: StrictInt = Field(default=1, ge=1)
    encoder: str = Field(default=DEFAULT_ENCODER, min_length=3)
    encoder_kwargs: dict[str, Any] = Field(default_factory=dict)
    weights: str | None = Field(default=None, min_length=1)
    memory_mb: StrictFloat = Field(default=256.0, ge=0)
    disk_mb: StrictFloat = Field(default=1024.0, ge=0)
    cache_dir: str = Field(default="{out}/latent-cache", min_length=1)
    threads: StrictInt | None = Field(default=None, ge=1)
    inline_below_ms: StrictFloat = Field(default=50.0, ge=0)
    tags: tuple[str, ...] = ()
    gpus: StrictInt = Field(default=0, ge=0)

    @field_validator("disk_mb")
    @classmethod
    def _keeps_entries(cls, value: float) -> float:
        too_small = disk_bound_problem(value * 2**20)
        if too_small:
            raise ValueError(too_small)
        return value


class TrainersSection(_Frozen):
    """The trainer ranks: the world size and where they run."""

    ranks: StrictInt = Field(default=1, ge=1)
    tags: tuple[str, ...] = ()
    gpus: StrictInt = Field(default=0, ge=0)
    threads: StrictInt | None = Field(default=None, ge=1)


class DatagenSection(_Frozen):
    """Data generation beside training: a pipeline file (relative to the train TOML's folder)."""

    pipeline: str = Field(min_length=1)
    items: StrictInt | None = Field(default=None, ge=1)


class TrainConfig(_Frozen):
    """A whole training run (see the module)."""

    train: TrainSection
    model: dict[str, Any] = Field(default_factory=dict)
    encoders: EncodersSection = EncodersSection()
    trainers: TrainersSection = TrainersSection()
    datagen: DatagenSection | None = None

    @field_validator("model")
    @classmethod
    def _world_model(cls, value: dict[str, Any]) -> dict[str, Any]:
        known = [f.name for f in dataclasses.fields(WorldModelConfig)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown key {unknown[0]!r}{hint}; expected some of {', '.join(known)}")
        try:
            WorldModelConfig(**value)
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc).removeprefix("WorldModelConfig.")) from None
        return value

    def world_model(self) -> WorldModelConfig:
        """The world model's shape."""
        return WorldModelConfig(**self.model)

    def with_out(self, out: Path | str) -> TrainConfig:
        """This config with ``{out}`` in every path replaced by ``out``."""

        def sub(value: Any) -> Any:
            return value.replace("{out}", str(out)) if isinstance(value, str) else value

        train = self.train.model_copy(
            update={"dataset": sub(self.train.dataset), "checkpoint_dir": sub(self.train.checkpoint_dir)}
        )
        encoders = self.encoders.model_copy(
            update={
                "cache_dir": sub(self.encoders.cache_dir),
                "weights": sub(self.encoders.weights),
                "encoder_kwargs": {k: sub(v) for k, v in self.encoders.encoder_kwargs.items()},
            }
        )
        return self.model_copy(update={"train": train, "encoders": encoders})

    def to_data(self) -> dict[str, Any]:
        """JSON data that :func:`load_train_config` reads back (what the driver sends a rank)."""
        return self.model_dump(mode="json", exclude_none=True)


def _vae_config(encoders: EncodersSection) -> dict[str, Any] | None:
    """The VideoVAEConfig fields of troupe's VAE encoder as the actors will build it."""
    from troupe.models.video_vae import VideoVAEConfig

    weights = encoders.weights
    kwargs = {k: v for k, v in encoders.encoder_kwargs.items() if k not in ("seed", "weights")}
    _check_vae_kwargs(kwargs)
    if weights is None and not kwargs:  # the shipped pretrained VAE, where there is one
        from troupe.actors.encoders import encoder_actor

        weights = getattr(encoder_actor, "PRETRAINED_VAE", None)
        weights = str(weights) if weights is not None else None
    if weights is not None:
        if "{out}" in weights:
            return None  # known only at start
        if not os.path.isfile(weights):
            if encoders.weights is None:
                return None  # the shipped VAE is not installed: the actors' start says so
            raise ConfigError(f"encoders.weights = {weights!r}: no such file (from {os.getcwd()})")
        try:
            blob = torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for a file that is no checkpoint
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise ConfigError(
                f"encoders.weights = {weights!r}: not a checkpoint torch can read ({reason}); "
                "`troupe models info FILE` says what a file holds"
            ) from None
        config = blob.get("config") if isinstance(blob, dict) else None
        return dict(config) if isinstance(config, dict) else None
    try:
        return dataclasses.asdict(VideoVAEConfig(**kwargs))
    except ValueError as exc:  # a value VideoVAEConfig refuses, said as the field the user wrote
        raise ConfigError(f"encoders.encoder_kwargs: {exc}".replace("VideoVAEConfig.", "")) from None


def _check_vae_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse a name troupe's VAE encoder does not take (``video_vae_encoder``: ``weights``,
    ``seed`` and the ``VideoVAEConfig`` fields) before anything starts: it had stopped the
    encoder actors as they started, after the cluster was up, the field unnamed.

    Raises:
        ConfigError: naming ``encoders.encoder_kwargs.NAME``, a close name, and those it takes.
    """
    from troupe.models.video_vae import VideoVAEConfig

    takes = ["weights", "seed", *(f.name for f in dataclasses.fields(VideoVAEConfig))]
    for name in kwargs:
        if name not in takes:
            close = difflib.get_close_matches(name, takes, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"encoders.encoder_kwargs.{name}: troupe's VAE encoder takes no argument {name!r}{hint}; "
                f"its arguments: {', '.join(takes)}"
            )


def encoder_geometry(encoders: EncodersSection) -> dict[str, int] | None:
    """``latent_channels``, ``spatial`` and ``temporal`` compression of the configured encoder,
    where they can be known before start (troupe's VAE or the light encoder); else None."""
    if encoders.encoder == DEFAULT_ENCODER:
        vae = _vae_config(encoders)
        if vae is None:
            return None
        return {
            "latent_channels": int(vae.get("latent_channels", 4)),
            "spatial": int(vae.get("spatial_compression", 4)),
            "temporal": int(vae.get("temporal_compression", 2)),
        }
    if encoders.encoder == LIGHT_ENCODER:
        kw = encoders.encoder_kwargs
        return {
            "latent_channels": int(kw.get("latent_channels", 4)),
            "spatial": int(kw.get("spatial", 4)),
            "temporal": int(kw.get("temporal", 2)),
        }
    return None


def check_geometry(config: TrainConfig, source: str = "config") -> None:
    """Refuse latents that cannot fit the world model, naming the fields and both numbers.

    Raises:
        ConfigError: latent channels, temporal compression, clip length or frame size mismatch.
    """
    try:
        geo = encoder_geometry(config.encoders)
    except ConfigError as exc:  # the weights named cannot be read
        raise ConfigError(f"{source}: {exc}") from None
    if geo is None:
        return
    model = config.world_model()
    enc = f"the encoder ({config.encoders.encoder})"
    if geo["latent_channels"] != model.latent_channels:
        raise ConfigError(
            f"{source}: model.latent_channels={model.latent_channels} but {enc} gives "
            f"{geo['latent_channels']} latent channels"
        )
    if geo["temporal"] != model.temporal_compression:
        raise ConfigError(
            f"{source}: model.temporal_compression={model.temporal_compression} but {enc} "
            f"compresses time by {geo['temporal']}"
        )
    if config.train.clip_frames % geo["temporal"]:
        raise ConfigError(
            f"{source}: train.clip_frames={config.train.clip_frames}: expected a multiple of "
            f"the encoder's temporal compression ({geo['temporal']})"
        )
    if config.train.size is None:
        return  # frames as recorded: known at the first step (FlowBatch.check)
    for name, side in zip(("height", "width"), config.train.size, strict=True):
        if side % geo["spatial"]:
            raise ConfigError(
                f"{source}: train.size {name}={side}: expected a multiple of the encoder's "
                f"spatial compression ({geo['spatial']})"
            )
        latent = side // geo["spatial"]
        if latent % model.patch_size or latent // model.patch_size > model.max_patches:
            raise ConfigError(
                f"{source}: train.size {name}={side} gives latents {latent} wide: expected a multiple "
                f"of model.patch_size ({model.patch_size}), at most model.max_patches "
                f"({model.max_patches}) patches"
            )


def load_train_config(source: str | os.PathLike[str] | dict[str, Any]) -> TrainConfig:
    """Load and validate a train TOML file, or its JSON data (:meth:`TrainConfig.to_data`).

    A ``[datagen]`` pipeline path is made absolute against the TOML file's folder.

    Raises:
        ConfigError: missing file, bad TOML, invalid fields or latents that cannot fit the
            world model; one line naming the file and the field.
    """
    if isinstance(source, dict):
        name, data = "train config", dict(source)
    else:
        path = Path(source)
        name = str(path)
        data = read_toml(path, "train", _SECTIONS, set(), _EXPECTED)
        datagen = data.get("datagen")
        if isinstance(datagen, dict) and isinstance(datagen.get("pipeline"), str):
            data["datagen"] = {**datagen, "pipeline": str(path.parent / datagen["pipeline"])}
    try:
        config = TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(name, exc, data, TrainConfig)) from None
    check_geometry(config, name)
    return config
