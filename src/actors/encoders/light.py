"""A light video encoder for tests and benchmarks of the encoder path: one strided 3D
convolution (non-overlapping windows, so causal in time), its weights fixed by a seed, so every
process that builds it with the same arguments computes the same function."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LightEncoder"]


class LightEncoder(nn.Module):
    """``(B, C, T, H, W)`` -> ``(B, latent_channels, T / temporal, H / spatial, W / spatial)``."""

    def __init__(
        self,
        in_channels: int = 3,
        latent_channels: int = 4,
        spatial: int = 4,
        temporal: int = 2,
        seed: int = 0,
    ) -> None:
        super().__init__()
        window = (temporal, spatial, spatial)
        self.conv = nn.Conv3d(in_channels, latent_channels, kernel_size=window, stride=window)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=gen) * 0.1)
            assert self.conv.bias is not None
            self.conv.bias.copy_(torch.randn(self.conv.bias.shape, generator=gen) * 0.1)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(video))
