"""The causal video VAE: shapes, causality, determinism, fingerprint, and that it learns."""

from __future__ import annotations

import pathlib

import pytest
import torch

from troupe.models.video_vae import VideoVAE, VideoVAEConfig, state_fingerprint


def _vae(**kw: int) -> VideoVAE:
    torch.manual_seed(0)
    kw.setdefault("base_channels", 8)
    return VideoVAE(VideoVAEConfig(**kw))


def _clip(b: int = 2, t: int = 8, h: int = 16, w: int = 16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand((b, 3, t, h, w), generator=g) * 2 - 1


@pytest.mark.parametrize(
    ("spatial", "temporal", "frames"),
    [(2, 1, 4), (4, 1, 4), (4, 2, 8), (8, 2, 8), (8, 4, 8)],
)
def test_shapes_follow_the_compressions(spatial: int, temporal: int, frames: int) -> None:
    vae = _vae(spatial_compression=spatial, temporal_compression=temporal, latent_channels=6)
    video = _clip(t=frames)
    with torch.no_grad():
        latents = vae.encode(video)
        out = vae(video)
    assert latents.shape == (2, 6, frames // temporal, 16 // spatial, 16 // spatial)
    assert vae.config.latent_shape(frames, 16, 16) == tuple(latents.shape[1:])
    assert out.reconstruction.shape == video.shape
    assert vae.decode(latents).shape == video.shape
    assert out.kl.ndim == 0 and out.kl.item() >= 0.0


@pytest.mark.parametrize("temporal", [1, 2, 4])
def test_latents_depend_only_on_frames_up_to_their_window_end(temporal: int) -> None:
    vae = _vae(spatial_compression=4, temporal_compression=temporal).eval()
    video = _clip(b=1, t=8)
    with torch.no_grad():
        base = vae.encode(video)
        for cut in range(1, 8):
            changed = video.clone()
            changed[:, :, cut:] = _clip(b=1, t=8 - cut, seed=cut + 10)  # the future, replaced
            latents = vae.encode(changed)
            kept = cut // temporal  # latent i ends on frame (i + 1) * temporal - 1
            torch.testing.assert_close(latents[:, :, :kept], base[:, :, :kept], rtol=0, atol=0)
            assert not torch.equal(latents[:, :, kept:], base[:, :, kept:])


def test_decoder_is_causal_in_the_latents() -> None:
    vae = _vae(spatial_compression=4, temporal_compression=2).eval()
    with torch.no_grad():
        z = vae.encode(_clip(b=1))
        changed = z.clone()
        changed[:, :, 2:] += 1.0
        a, b = vae.decode(z), vae.decode(changed)
    torch.testing.assert_close(a[:, :, :4], b[:, :, :4], rtol=0, atol=0)
    assert not torch.equal(a[:, :, 4:], b[:, :, 4:])


def test_encode_is_deterministic_and_per_sample() -> None:
    vae = _vae()
    video = _clip(b=3)
    with torch.no_grad():
        first, second = vae.encode(video), vae.encode(video)
        alone = torch.cat([vae.encode(video[i : i + 1]) for i in range(3)])
        encoder = vae.frozen_encoder()
        via_module = encoder(video)
    assert torch.equal(first, second)
    torch.testing.assert_close(alone, first)  # other samples of a batch never change a latent
    assert torch.equal(via_module, first)
    assert not any(p.requires_grad for p in encoder.parameters())


def test_fingerprint_changes_with_a_weight_and_only_then(tmp_path: pathlib.Path) -> None:
    vae = _vae()
    fp = vae.fingerprint()
    assert fp == _vae().fingerprint()  # same seed, same weights: same fingerprint
    assert fp == vae.frozen_encoder().fingerprint()
    with torch.no_grad():
        vae.encode(_clip())
    assert vae.fingerprint() == fp  # running it does not change it

    path = tmp_path / "vae.pt"
    vae.save(path)
    loaded = VideoVAE.load(path)
    assert loaded.fingerprint() == fp and loaded.config == vae.config

    with torch.no_grad():
        vae.decoder.conv_out.conv.bias[0] += 1e-3
    assert vae.fingerprint() != fp
    other_config = _vae(latent_channels=4, base_channels=8, frames=16)  # same weights' shapes
    other_config.load_state_dict(loaded.state_dict())
    assert other_config.fingerprint() != fp  # the config is part of what is hashed


def test_state_fingerprint_covers_any_module() -> None:
    torch.manual_seed(0)
    a = torch.nn.Conv3d(3, 4, 1)
    torch.manual_seed(0)
    b = torch.nn.Conv3d(3, 4, 1)
    assert state_fingerprint(a) == state_fingerprint(b)
    assert state_fingerprint(a, "x") != state_fingerprint(a, "y")
    with torch.no_grad():
        b.weight[0, 0, 0, 0, 0] += 1.0
    assert state_fingerprint(a) != state_fingerprint(b)


def test_a_few_steps_reduce_the_reconstruction_loss() -> None:
    vae = _vae(spatial_compression=4, temporal_compression=2, frames=4)
    video = _clip(b=2, t=4, h=8, w=8)
    opt = torch.optim.Adam(vae.parameters(), lr=3e-3)

    def recon() -> torch.Tensor:
        out = vae(video)
        return (out.reconstruction - video).square().mean(), out.kl

    with torch.no_grad():
        before = recon()[0].item()
    for _ in range(15):
        mse, kl = recon()
        opt.zero_grad()
        (mse + 1e-4 * kl).backward()
        opt.step()
    with torch.no_grad():
        after = recon()[0].item()
    assert after < 0.8 * before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("spatial_compression", 6),
        ("spatial_compression", 1),
        ("temporal_compression", 3),
        ("frames", 7),
        ("latent_channels", 0),
    ],
)
def test_bad_config_names_the_field(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=f"{field}={value}"):
        VideoVAEConfig(**{field: value})


def test_temporal_compression_above_spatial_is_refused() -> None:
    with pytest.raises(ValueError, match="temporal_compression=4"):
        VideoVAEConfig(spatial_compression=2, temporal_compression=4)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((1, 3, 7, 16, 16), "frames=7"),
        ((1, 3, 8, 18, 16), "height=18"),
        ((1, 3, 8, 16, 10), "width=10"),
        ((1, 1, 8, 16, 16), r"video shape \(1, 1, 8, 16, 16\)"),
    ],
)
def test_bad_video_names_the_dimension(shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _vae().encode(torch.zeros(shape))
