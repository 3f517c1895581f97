"""``troupe models train-vae`` writes a checkpoint VideoVAE.load reads, refuses to overwrite one
and bad data with one line and exit status 2; ``troupe models info`` shows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from troupe.actors.training.dataset import LeRobotClips
from troupe.cli.commands.models import parse_size
from troupe.cli.main import app
from troupe.models.video_vae import VideoVAE

pytestmark = pytest.mark.usefixtures("restore_threads")  # tests/cli/conftest.py

TINY = [
    "--clip-frames",
    "4",
    "--size",
    "16x16",
    "--base-channels",
    "4",
    "--batch-size",
    "2",
    "--threads",
    "1",
]


def test_train_vae_writes_a_checkpoint_that_encodes(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "vae.pt"
    result = CliRunner().invoke(
        app, ["models", "train-vae", str(run), "--out", str(out), "--steps", "3", *TINY]
    )
    assert result.exit_code == 0, result.output
    assert "step 3/3" in result.output and "recon MSE" in result.output and "wrote" in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["vae.pt"]  # no temporary left beside it
    vae = VideoVAE.load(out)
    assert vae.config.base_channels == 4 and vae.config.frames == 4
    clip = LeRobotClips(run, clip_frames=4, size=(16, 16))[0]["video"]
    latents = vae.frozen_encoder()(clip[None].float() / 127.5 - 1.0)
    assert latents.shape == (1, 4, 2, 4, 4) and torch.isfinite(latents).all()
    info = CliRunner().invoke(app, ["models", "info", str(out)])
    assert info.exit_code == 0 and vae.fingerprint() in info.output and "base_channels = 4" in info.output


def test_train_vae_stopped_says_where_and_writes_nothing(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C mid-training: exit 130 with a line naming the step reached and that nothing was
    written (it exited 130 saying nothing, the steps done gone without a word)."""
    from troupe.actors.training import vae_training

    def interrupted(*_: object, on_progress: Any, **__: object) -> Any:
        for step in (1, 2, 3):
            on_progress(step, {"loss": 1.0, "recon": 1.0})
        raise KeyboardInterrupt

    monkeypatch.setattr(vae_training, "train_vae", interrupted)
    out = tmp_path / "vae.pt"
    result = CliRunner().invoke(
        app, ["models", "train-vae", str(run), "--out", str(out), "--steps", "50", *TINY]
    )
    assert result.exit_code == 130, result.output
    assert "stopped at step 3/50: nothing written" in " ".join(result.output.split())
    assert not out.exists()


def test_train_vae_json(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "vae.pt"
    argv = ["models", "train-vae", str(run), "--out", str(out), "--steps", "1", "--json", *TINY]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert {"final_loss", "recon_mse", "recon_mse_untrained", "seconds", "fingerprint"} <= figures.keys()
    assert figures["fingerprint"] == VideoVAE.load(out).fingerprint()


def test_an_existing_out_is_refused_unless_forced(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "vae.pt"
    out.write_bytes(b"keep me")
    argv = ["models", "train-vae", str(run), "--out", str(out), "--steps", "1", *TINY]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and "already exists" in result.output and "--force" in result.output
    assert out.read_bytes() == b"keep me"
    assert CliRunner().invoke(app, [*argv, "--force"]).exit_code == 0
    assert VideoVAE.load(out).config.base_channels == 4


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["DATA"], "nowhere"),
        (["RUN", "--size", "16by16"], "--size '16by16'"),
        (["RUN", "--spatial-compression", "3"], "spatial_compression=3"),
        (["RUN", "--clip-frames", "64"], "--clip-frames"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run: Path, tmp_path: Path, argv: list[str], named: str) -> None:
    data = str(tmp_path / "nowhere") if argv[0] == "DATA" else str(run)
    out = tmp_path / "vae.pt"
    result = CliRunner().invoke(
        app, ["models", "train-vae", data, *argv[1:], "--out", str(out), "--steps", "1"]
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and named in lines[0]
    assert not out.exists()


def test_info_of_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not torch")
    result = CliRunner().invoke(app, ["models", "info", str(bad)])
    assert result.exit_code == 2 and "not a troupe VAE checkpoint" in result.output


def test_parse_size() -> None:
    assert parse_size("64x48") == (64, 48) and parse_size(" 8 X 8 ") == (8, 8)
    for bad in ("64", "0x8", "ax8", "-1x2"):
        with pytest.raises(ValueError, match="HxW"):
            parse_size(bad)
