"""Weights holding a nan or an inf (saved from a training that diverged, or damaged) are refused
where they are read: `models info` said nothing of them, and a training run whose encoder loaded
them failed at its first step blaming `train.lr` ("the loss is nan (train.lr = 0.001)")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from troupe.actors.encoders.encoder_actor import load_encoder
from troupe.cli.main import app
from troupe.models.video_vae import VideoVAE, VideoVAEConfig, non_finite
from troupe.runtime.errors import ConfigError

ENCODER = "troupe.actors.encoders.encoder_actor:video_vae_encoder"


def _saved(tmp_path: Path, poison: float | None) -> Path:
    torch.manual_seed(0)
    vae = VideoVAE(VideoVAEConfig(base_channels=4, latent_channels=4, frames=4))
    if poison is not None:
        with torch.no_grad():
            next(iter(vae.parameters())).view(-1)[0] = poison
    path = tmp_path / "vae.pt"
    vae.save(path)
    return path


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_an_encoder_with_such_weights_is_refused_naming_them(tmp_path: Path, poison: float) -> None:
    path = _saved(tmp_path, poison)
    with pytest.raises(ConfigError, match=r"1 weight tensor\(s\) hold nan or inf \(e\.g\. "):
        load_encoder(ENCODER, {}, str(path))


def test_models_info_refuses_them(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["models", "info", str(_saved(tmp_path, float("nan")))])
    assert result.exit_code != 0
    assert "hold nan or inf" in " ".join(result.output.split())


def test_finite_weights_pass(tmp_path: Path) -> None:
    path = _saved(tmp_path, None)
    assert non_finite(VideoVAE.load(path).state_dict()) == []
    load_encoder(ENCODER, {}, str(path))
    assert CliRunner().invoke(app, ["models", "info", str(path)]).exit_code == 0
