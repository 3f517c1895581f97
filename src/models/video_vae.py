"""A small video VAE with a causal 3D-convolutional encoder and decoder.

The encoder maps a clip ``(B, C, T, H, W)`` with values in [-1, 1] to latents
``(B, latent_channels, T / temporal_compression, H / spatial_compression, W / spatial_compression)``.
It is causal in time: every convolution pads only on the past side of the time axis, temporal
downsampling windows end on the last frame they summarise, and normalisation is per frame, so
latent ``i`` depends only on frames ``<= (i + 1) * temporal_compression - 1`` (the end of its
window). Every sample is encoded independently of the others in its batch.

The encoder actors run the encoder frozen (:meth:`VideoVAE.frozen_encoder`) and key their latent
cache on :meth:`VideoVAE.fingerprint`. Nothing here imports the runtime or the actors.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ARCHITECTURE_VERSION",
    "CausalConv3d",
    "FrameNorm",
    "ResBlock",
    "Upsample",
    "VAEOutput",
    "VideoEncoder",
    "VideoVAE",
    "VideoVAEConfig",
    "non_finite",
    "state_fingerprint",
]

ARCHITECTURE_VERSION = 1
"""Bumped whenever the computation changes for the same weights: part of every fingerprint, so a
latent cached by older code is never taken for one of the new."""

_LOGVAR_RANGE = (-30.0, 20.0)  # exp() of either end stays finite in float32


@dataclass(frozen=True)
class VideoVAEConfig:
    """Shape of a :class:`VideoVAE`.

    Attributes:
        in_channels: channels of a frame (3 for RGB).
        latent_channels: channels of a latent.
        base_channels: width of the first level; deeper levels widen up to 4x.
        spatial_compression: height and width are divided by this, a power of 2 (>= 2).
        temporal_compression: time is divided by this: 1, 2 or 4, at most ``spatial_compression``.
        frames: clip length the model is built and trained for (a multiple of
            ``temporal_compression``); :meth:`VideoVAE.encode` takes any such multiple.
    """

    in_channels: int = 3
    latent_channels: int = 4
    base_channels: int = 32
    spatial_compression: int = 4
    temporal_compression: int = 2
    frames: int = 8

    def __post_init__(self) -> None:
        for name in ("in_channels", "latent_channels", "base_channels", "frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"VideoVAEConfig.{name}={value!r}: expected a positive integer")
        sc = self.spatial_compression
        if not isinstance(sc, int) or sc < 2 or sc & (sc - 1):
            raise ValueError(f"VideoVAEConfig.spatial_compression={sc!r}: expected a power of 2 (>= 2)")
        tc = self.temporal_compression
        if tc not in (1, 2, 4) or tc > sc:
            raise ValueError(
                f"VideoVAEConfig.temporal_compression={tc!r}: expected 1, 2 or 4, "
                f"at most spatial_compression ({sc})"
            )
        if self.frames % tc:
            raise ValueError(
                f"VideoVAEConfig.frames={self.frames}: expected a multiple of temporal_compression ({tc})"
            )

    @property
    def spatial_levels(self) -> int:
        return self.spatial_compression.bit_length() - 1

    @property
    def temporal_levels(self) -> int:
        return self.temporal_compression.bit_length() - 1

    def level_channels(self, level: int) -> int:
        return self.base_channels * 2 ** min(level, 2)

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """``(latent_channels, T', H', W')`` for a clip of this size (checked as :meth:`VideoVAE.encode`)."""
        tc, sc = self.temporal_compression, self.spatial_compression
        for name, value, step in (("frames", frames, tc), ("height", height, sc), ("width", width, sc)):
            if value < step or value % step:
                raise ValueError(f"video {name}={value}: expected a positive multiple of {step}")
        return (self.latent_channels, frames // tc, height // sc, width // sc)


class VAEOutput(NamedTuple):
    """What :meth:`VideoVAE.forward` returns."""

    reconstruction: torch.Tensor
    """(B, C, T, H, W), the decoded latents."""
    kl: torch.Tensor
    """Scalar: KL divergence to N(0, I), averaged over latent elements."""
    mean: torch.Tensor
    logvar: torch.Tensor


class CausalConv3d(nn.Module):
    """A 3D convolution that pads time on the past side only.

    With stride ``s`` in time the padding is ``kernel - s``, so output ``i`` covers input frames
    ``[(i + 1) s - kernel, (i + 1) s - 1]``: it ends on the last frame of its window.
    """

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: tuple[int, int, int] = (1, 1, 1)):
        super().__init__()
        self.time_pad = kernel - stride[0]
        self.conv = nn.Conv3d(cin, cout, kernel, stride=stride, padding=(0, kernel // 2, kernel // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Past padding repeats the first frame: a clip's start looks like a still scene.
        x = torch.cat([x[:, :, :1].expand(-1, -1, self.time_pad, -1, -1), x], dim=2)
        return self.conv(x)


class FrameNorm(nn.Module):
    """GroupNorm over each frame alone: statistics over time would leak the future."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(min(8, channels), channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        y = self.norm(x.transpose(1, 2).reshape(b * t, c, h, w))
        return y.reshape(b, t, c, h, w).transpose(1, 2)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = FrameNorm(cin)
        self.conv1 = CausalConv3d(cin, cout)
        self.norm2 = FrameNorm(cout)
        self.conv2 = CausalConv3d(cout, cout)
        self.skip = nn.Conv3d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class Upsample(nn.Module):
    """Nearest-neighbour upsampling (x2 in space, ``time`` in time) then a causal convolution.

    Repeating latent ``i`` over frames ``[i s, (i + 1) s - 1]`` keeps the decoder causal too.
    """

    def __init__(self, channels: int, time: int):
        super().__init__()
        self.time = time
        self.conv = CausalConv3d(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.repeat_interleave(self.time, dim=2) if self.time > 1 else x
        x = x.repeat_interleave(2, dim=3).repeat_interleave(2, dim=4)
        return self.conv(x)


class _Encoder(nn.Module):
    def __init__(self, cfg: VideoVAEConfig):
        super().__init__()
        self.conv_in = CausalConv3d(cfg.in_channels, cfg.base_channels)
        blocks: list[nn.Module] = []
        cin = cfg.base_channels
        for level in range(cfg.spatial_levels):
            cout = cfg.level_channels(level)
            blocks.append(ResBlock(cin, cout))
            time_stride = 2 if level < cfg.temporal_levels else 1
            blocks.append(CausalConv3d(cout, cout, stride=(time_stride, 2, 2)))
            cin = cout
        blocks.append(ResBlock(cin, cin))
        self.blocks = nn.Sequential(*blocks)
        self.norm_out = FrameNorm(cin)
        self.conv_out = CausalConv3d(cin, 2 * cfg.latent_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_out(F.silu(self.norm_out(self.blocks(self.conv_in(x)))))


class _Decoder(nn.Module):
    def __init__(self, cfg: VideoVAEConfig):
        super().__init__()
        top = cfg.level_channels(cfg.spatial_levels - 1)
        self.conv_in = CausalConv3d(cfg.latent_channels, top)
        blocks: list[nn.Module] = [ResBlock(top, top)]
        cin = top
        for level in reversed(range(cfg.spatial_levels)):
            cout = cfg.level_channels(level)
            time = 2 if level < cfg.temporal_levels else 1
            blocks += [Upsample(cin, time), ResBlock(cin, cout)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.norm_out = FrameNorm(cin)
        self.conv_out = CausalConv3d(cin, cfg.in_channels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.conv_out(F.silu(self.norm_out(self.blocks(self.conv_in(z)))))


class VideoVAE(nn.Module):
    """The video VAE: :meth:`encode`, :meth:`decode`, and :meth:`forward` for training."""

    def __init__(self, config: VideoVAEConfig | None = None):
        super().__init__()
        self.config = config or VideoVAEConfig()
        self.encoder = _Encoder(self.config)
        self.decoder = _Decoder(self.config)

    def _check_video(self, video: torch.Tensor) -> None:
        cfg = self.config
        if video.ndim != 5 or video.shape[1] != cfg.in_channels:
            raise ValueError(f"video shape {tuple(video.shape)}: expected (B, {cfg.in_channels}, T, H, W)")
        cfg.latent_shape(*video.shape[2:])

    def encode_dist(self, video: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance of the latents, each ``(B, latent_channels, T', H', W')``.

        Raises:
            ValueError: the shape does not fit the config (names the bad dimension).
        """
        self._check_video(video)
        mean, logvar = self.encoder(video).chunk(2, dim=1)
        return mean, logvar.clamp(*_LOGVAR_RANGE)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Deterministic latents (the posterior mean) of ``video`` (B, C, T, H, W) in [-1, 1]."""
        return self.encode_dist(video)[0]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Frames ``(B, C, T, H, W)`` from latents ``(B, latent_channels, T', H', W')``."""
        lc = self.config.latent_channels
        if latents.ndim != 5 or latents.shape[1] != lc:
            raise ValueError(f"latents shape {tuple(latents.shape)}: expected (B, {lc}, T', H', W')")
        return self.decoder(latents)

    def forward(
        self, video: torch.Tensor, sample: bool = False, generator: torch.Generator | None = None
    ) -> VAEOutput:
        """Encode, decode and measure the KL term.

        Args:
            video: (B, C, T, H, W) in [-1, 1].
            sample: decode a reparameterised sample instead of the mean.
            generator: the noise's source when sampling (for reproducible runs).
        """
        mean, logvar = self.encode_dist(video)
        z = mean
        if sample:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            z = mean + noise * torch.exp(0.5 * logvar)
        kl = 0.5 * (mean.square() + logvar.exp() - 1.0 - logvar).mean()
        return VAEOutput(self.decode(z), kl, mean, logvar)

    def fingerprint(self) -> str:
        """sha256 (hex) of the weights, the class path, the config and :data:`ARCHITECTURE_VERSION`.

        Equal fingerprints mean :meth:`encode` computes the same function.
        """
        return state_fingerprint(self, json.dumps(asdict(self.config), sort_keys=True))

    def frozen_encoder(self) -> VideoEncoder:
        """The encoder alone, in eval mode without gradients: video batch -> latents (the mean)."""
        return VideoEncoder(self)

    def save(self, path: str | Path) -> None:
        """Write config and weights to ``path`` (a torch file :meth:`load` reads)."""
        torch.save({"config": asdict(self.config), "state_dict": self.state_dict()}, Path(path))

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> VideoVAE:
        """Read a file written by :meth:`save` (weights only: no code is unpickled)."""
        blob = torch.load(Path(path), map_location=map_location, weights_only=True)
        model = cls(VideoVAEConfig(**blob["config"]))
        model.load_state_dict(blob["state_dict"])
        return model


class VideoEncoder(nn.Module):
    """A frozen VAE encoder as a plain module: ``forward(video) -> latents`` (the mean)."""

    def __init__(self, vae: VideoVAE):
        super().__init__()
        self.vae = vae
        self.vae.eval().requires_grad_(False)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.vae.encode(video)

    def fingerprint(self) -> str:
        return self.vae.fingerprint()


def non_finite(state: dict[str, torch.Tensor]) -> list[str]:
    """The names of the floating tensors of ``state`` holding a nan or an inf, sorted: weights
    saved from a training that diverged encode every input to nan, and the trainer downstream
    took the blame (its loss nan "at this learning rate")."""
    return sorted(
        name
        for name, tensor in state.items()
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())
    )


def state_fingerprint(module: nn.Module, *extra: str) -> str:
    """sha256 (hex) of a module's class path, its state dict (names, dtypes, shapes, bytes),
    :data:`ARCHITECTURE_VERSION` and ``extra`` strings (e.g. its config).

    Works for any torch module, so a cache can key on encoders that are not a :class:`VideoVAE`.
    """
    h = hashlib.sha256()
    cls = type(module)
    h.update(f"{cls.__module__}.{cls.__qualname__}\0v{ARCHITECTURE_VERSION}\0".encode())
    for part in extra:
        h.update(part.encode() + b"\0")
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
