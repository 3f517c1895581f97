"""The embedded default pipeline of ``troupe run`` (configs/datagen.toml is the same, editable)."""

from __future__ import annotations

from typing import Any

from troupe.runtime.pipeline.config import PipelineConfig

from .embedded_pipeline import DEFAULT_PIPELINE

__all__ = ["DEFAULT_PIPELINE", "default_pipeline"]


def default_pipeline(**overrides: Any) -> PipelineConfig:
    """The default pipeline, with [pipeline] fields replaced by ``overrides``."""
    data = {**DEFAULT_PIPELINE, **{k: v for k, v in overrides.items() if v is not None}}
    return PipelineConfig.model_validate(data)
