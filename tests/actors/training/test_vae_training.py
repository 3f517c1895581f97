"""train_vae lowers the VAE's loss on real clips, seeded; the shipped checkpoint is the default
encoder and reconstructs generated data better than an untrained VAE of its config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from support.clip_data import finalize, generated_run, write_run
from troupe.actors.encoders.encoder_actor import PRETRAINED_VAE, EncoderActor, video_vae_encoder
from troupe.actors.training.dataset import LeRobotClips
from troupe.actors.training.vae_training import held_out_split, recon_mse, train_vae
from troupe.models.video_vae import VideoVAE, VideoVAEConfig

TINY = VideoVAEConfig(base_channels=4, frames=4)
SHIPPED_SIZE = (32, 32)  # what the shipped VAE was trained at (src/models/weights/README.md)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: on a busy 2-core machine two threads wait on each other for seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> LeRobotClips:
    base = tmp_path_factory.mktemp("vae")
    write_run(base / "run", {"ep-a": 24, "ep-b": 20, "ep-c": 16})
    finalize(base / "run", base / "dataset")
    return LeRobotClips(base / "dataset", clip_frames=4, size=(16, 16), stride=2)


def test_a_few_steps_reduce_the_loss(clips: LeRobotClips) -> None:
    seen: list[tuple[int, dict[str, float]]] = []
    vae, figures = train_vae(
        clips, TINY, steps=25, batch_size=4, lr=3e-3, seed=0, on_progress=lambda s, v: seen.append((s, v))
    )
    losses = [v["loss"] for _, v in seen]
    assert [s for s, _ in seen] == list(range(1, 26))
    assert sum(losses[-5:]) / 5 < 0.7 * (sum(losses[:5]) / 5)
    assert figures["recon_mse"] < figures["recon_mse_untrained"]
    assert figures["final_loss"] == pytest.approx(sum(losses[-10:]) / 10)
    assert figures["steps"] == 25 and figures["clips"] == len(clips) and figures["held_out"] >= 1
    assert not vae.training and next(vae.parameters()).device.type == "cpu"


def test_a_short_runs_first_and_final_loss_share_no_step(clips: LeRobotClips) -> None:
    """Five steps: the first loss is the mean of steps 1-2, the final one of steps 4-5 (both
    took the same ten-step window, and read as a loss that never moved)."""
    seen: list[float] = []
    _, figures = train_vae(
        clips, TINY, steps=5, batch_size=2, seed=0, on_progress=lambda s, v: seen.append(v["loss"])
    )
    assert figures["first_loss"] == pytest.approx(sum(seen[:2]) / 2)
    assert figures["final_loss"] == pytest.approx(sum(seen[-2:]) / 2)
    assert figures["first_loss"] != figures["final_loss"]


def test_training_is_seeded(clips: LeRobotClips) -> None:
    runs = [train_vae(clips, TINY, steps=3, batch_size=2, seed=s)[0] for s in (5, 5, 6)]
    assert runs[0].fingerprint() == runs[1].fingerprint() != runs[2].fingerprint()


def test_clips_that_do_not_fit_the_config_are_named(clips: LeRobotClips) -> None:
    with pytest.raises(ValueError, match=r"clips of shape \(3, 4, 16, 16\).*spatial_compression=32"):
        train_vae(clips, VideoVAEConfig(base_channels=4, frames=4, spatial_compression=32), 1, 1)
    with pytest.raises(ValueError, match="steps=0"):
        train_vae(clips, TINY, steps=0, batch_size=1)


def test_held_out_split() -> None:
    assert held_out_split(1) == ([0], [0])
    train, held = held_out_split(25)
    assert held == [23, 24] and train == list(range(23))
    assert len(held_out_split(10_000)[1]) == 32


# -- the shipped checkpoint ----------------------------------------------------------------------


def _weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_default_encoder_is_the_shipped_vae() -> None:
    shipped = VideoVAE.load(PRETRAINED_VAE)
    assert PRETRAINED_VAE.stat().st_size <= 2 * 2**20
    assert _weights_equal(video_vae_encoder().vae, shipped)  # type: ignore[arg-type]
    actor = EncoderActor(device="cpu", disk_mb=0)
    assert _weights_equal(actor.module.vae, shipped)  # type: ignore[arg-type]
    # A seed or a config still builds an untrained VAE of that shape.
    random = video_vae_encoder(seed=0, **shipped.config.__dict__)
    assert not _weights_equal(random.vae, shipped)  # type: ignore[arg-type]
    assert video_vae_encoder(base_channels=4).vae.config.base_channels == 4  # type: ignore[union-attr]


@pytest.mark.e2e
def test_the_shipped_vae_reconstructs_generated_clips(tmp_path: Path) -> None:
    shipped = VideoVAE.load(PRETRAINED_VAE)
    cfg = shipped.config
    run = generated_run(tmp_path / "run", items=2)
    data = LeRobotClips(run, clip_frames=cfg.frames, size=SHIPPED_SIZE)
    torch.manual_seed(0)
    untrained = VideoVAE(cfg)
    picks: list[Any] = list(range(min(len(data), 4)))
    assert picks, "the generated episodes are shorter than one clip"
    trained_mse = recon_mse(shipped, data, picks)
    assert trained_mse < 0.5 * recon_mse(untrained, data, picks)
    latents = shipped.frozen_encoder()(torch.stack([data[0]["video"]]).float() / 127.5 - 1.0)
    assert latents.shape == (1, *cfg.latent_shape(cfg.frames, *SHIPPED_SIZE))
