"""A small world-action model trained with flow matching.

One transformer sees two kinds of tokens on one time axis:

- video latent tokens: latents ``(B, C, T', H', W')`` (from :mod:`troupe.models.video_vae`) cut
  into ``patch_size x patch_size`` patches, one token per patch of each latent frame;
- action tokens: one per action step, the fixed 59-dim layout (DESIGN.md, "The action layout")
  together with its validity mask, so a missing field is never read as a real zero.

Positions are times in seconds: latent frame ``i`` sits at ``i / latent_rate`` with
``latent_rate = fps / temporal_compression``, action step ``j`` at ``j / fps`` (both clocks start
at the clip's first frame), so latent ``i`` and action ``i * temporal_compression`` share a time.

Per token, two masks are kept apart: *condition* (given: the clean value goes in) and *target*
(predicted: the noisy value goes in, and the loss is taken there). A token that is neither is
padding: no other token attends to it. Flow matching: with noise ``x0`` and data ``x1``,
``x_t = (1 - t) x0 + t x1`` and the model predicts the velocity ``x1 - x0``; the loss is the mean
squared error over valid target elements only (target mask AND, for actions, the validity mask),
and 0 (still differentiable) when there is none. Nothing here imports the runtime or the actors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ACTION_DIM",
    "FlowBatch",
    "FlowLoss",
    "WorldModel",
    "WorldModelConfig",
    "action_times",
    "flow_matching_loss",
    "latent_times",
]

ACTION_DIM = 59
"""Width of the action layout (troupe.actors.lerobot.action_layout; models do not import actors)."""


@dataclass(frozen=True)
class WorldModelConfig:
    """Shape of a :class:`WorldModel`.

    Attributes:
        latent_channels: channels of the video latents.
        patch_size: side of the square latent patch one token covers.
        action_dim: width of an action (the 59-dim layout).
        d_model, layers, heads, mlp_ratio: the transformer.
        fps: video frame rate, which is also the action rate.
        temporal_compression: frames per latent frame (the VAE's).
        max_patches: most patches along a latent side (size of the learned row/column tables).
    """

    latent_channels: int = 4
    patch_size: int = 2
    action_dim: int = ACTION_DIM
    d_model: int = 128
    layers: int = 4
    heads: int = 4
    mlp_ratio: float = 4.0
    fps: float = 10.0
    temporal_compression: int = 2
    max_patches: int = 32

    def __post_init__(self) -> None:
        for name in ("latent_channels", "patch_size", "action_dim", "d_model", "layers", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"WorldModelConfig.{name}={value!r}: expected a positive integer")
        if self.d_model % self.heads:
            raise ValueError(
                f"WorldModelConfig.d_model={self.d_model}: expected a multiple of heads ({self.heads})"
            )
        if not self.fps > 0:
            raise ValueError(f"WorldModelConfig.fps={self.fps!r}: expected a positive rate")
        if self.temporal_compression < 1:
            raise ValueError(
                f"WorldModelConfig.temporal_compression={self.temporal_compression!r}: expected >= 1"
            )

    @property
    def latent_rate(self) -> float:
        return self.fps / self.temporal_compression


def latent_times(count: int, fps: float, temporal_compression: int) -> torch.Tensor:
    """Times in seconds of ``count`` latent frames: ``i * temporal_compression / fps``."""
    return torch.arange(count, dtype=torch.float64) * temporal_compression / fps


def action_times(count: int, fps: float) -> torch.Tensor:
    """Times in seconds of ``count`` action steps: ``j / fps``."""
    return torch.arange(count, dtype=torch.float64) / fps


@dataclass(frozen=True)
class FlowBatch:
    """One batch for the world model (all tensors on one device).

    Attributes:
        latents: (B, C, T', H', W') clean latents (the data, x1).
        latent_condition: (B, T') bool, latent frames given.
        latent_target: (B, T') bool, latent frames predicted.
        actions: (B, Ta, 59) clean actions; invalid elements may hold anything (NaN included).
        action_valid: (B, Ta, 59) bool validity of each element.
        action_condition: (B, Ta) bool, action steps given.
        action_target: (B, Ta) bool, action steps predicted.
    """

    latents: torch.Tensor
    latent_condition: torch.Tensor
    latent_target: torch.Tensor
    actions: torch.Tensor
    action_valid: torch.Tensor
    action_condition: torch.Tensor
    action_target: torch.Tensor

    def check(self, config: WorldModelConfig) -> None:
        """Raise ValueError naming the first field whose shape or dtype does not fit."""
        lat, act = self.latents, self.actions
        if lat.ndim != 5 or lat.shape[1] != config.latent_channels:
            raise ValueError(
                f"FlowBatch.latents shape {tuple(lat.shape)}: "
                f"expected (B, {config.latent_channels}, T', H', W')"
            )
        p = config.patch_size
        for name, side in (("height", lat.shape[3]), ("width", lat.shape[4])):
            if side % p or side // p > config.max_patches:
                raise ValueError(
                    f"FlowBatch.latents {name}={side}: expected a multiple of patch_size ({p}), "
                    f"at most {config.max_patches} patches"
                )
        b, tl = lat.shape[0], lat.shape[2]
        if act.ndim != 3 or act.shape[0] != b or act.shape[2] != config.action_dim:
            raise ValueError(
                f"FlowBatch.actions shape {tuple(act.shape)}: expected ({b}, Ta, {config.action_dim})"
            )
        ta = act.shape[1]
        expect = {
            "action_valid": (tuple(act.shape), self.action_valid),
            "latent_condition": ((b, tl), self.latent_condition),
            "latent_target": ((b, tl), self.latent_target),
            "action_condition": ((b, ta), self.action_condition),
            "action_target": ((b, ta), self.action_target),
        }
        for name, (shape, tensor) in expect.items():
            if tuple(tensor.shape) != shape or tensor.dtype != torch.bool:
                raise ValueError(
                    f"FlowBatch.{name}: {tensor.dtype} {tuple(tensor.shape)}, expected bool {shape}"
                )
        if (self.latent_condition & self.latent_target).any() or (
            self.action_condition & self.action_target
        ).any():
            raise ValueError("FlowBatch: a token is both condition and target; the masks must be disjoint")


class FlowLoss(NamedTuple):
    """What :meth:`WorldModel.loss` returns."""

    loss: torch.Tensor
    """Scalar: mean squared velocity error over all valid target elements (latents and actions)."""
    latent_loss: torch.Tensor
    action_loss: torch.Tensor
    latent_count: int
    action_count: int


def flow_matching_loss(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``(pred - target)^2`` over elements where ``mask`` holds; 0 when none does.

    Elements outside the mask never reach the sum (NaN or inf there is harmless), and the empty
    case returns a zero that still carries ``pred``'s graph, so ``backward()`` always works.
    """
    zero = torch.zeros((), dtype=pred.dtype, device=pred.device)
    # Mask both sides before subtracting: masking the difference would still send NaN gradients
    # back through the masked-out elements (0 * NaN).
    diff = torch.where(mask, pred, zero) - torch.where(mask, target, zero)
    return diff.square().sum() / mask.sum().clamp(min=1)


def _sinusoid(x: torch.Tensor, dim: int, max_period: float) -> torch.Tensor:
    """(..., dim) sinusoidal features of the float positions ``x`` (...)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = x.float().unsqueeze(-1) * freqs
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class _Block(nn.Module):
    """Pre-norm transformer block whose norms are shifted, scaled and gated by the flow time."""

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        d = cfg.d_model
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False)
        hidden = int(d * cfg.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
        self.modulation = nn.Linear(d, 6 * d)
        nn.init.zeros_(self.modulation.weight)  # starts as the identity: gates are 0
        nn.init.zeros_(self.modulation.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(cond).unsqueeze(1).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        q, k, v = self.qkv(h).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=attend[:, None, None, :])
        x = x + gate1 * self.proj(h.transpose(1, 2).reshape(b, n, d))
        h = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.mlp(h)


class WorldModel(nn.Module):
    """The world-action model: :meth:`velocity` predicts, :meth:`loss` trains, :meth:`sample` generates."""

    def __init__(self, config: WorldModelConfig | None = None):
        super().__init__()
        cfg = self.config = config or WorldModelConfig()
        d, p = cfg.d_model, cfg.patch_size
        self.latent_in = nn.Linear(cfg.latent_channels * p * p, d)
        self.action_in = nn.Linear(2 * cfg.action_dim, d)  # values and validity bits
        self.kind = nn.Embedding(2, d)  # 0 latent, 1 action
        self.role = nn.Embedding(2, d)  # 0 condition (clean), 1 target (noisy)
        self.row = nn.Embedding(cfg.max_patches, d)
        self.col = nn.Embedding(cfg.max_patches, d)
        self.time_mlp = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        self.norm_out = nn.LayerNorm(d)
        self.latent_out = nn.Linear(d, cfg.latent_channels * p * p)
        self.action_out = nn.Linear(d, cfg.action_dim)

    def _patchify(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, C, T', H', W') -> (B, T' * h * w, C * p * p), frame-major then row then column."""
        b, c, t, hh, ww = latents.shape
        p = self.config.patch_size
        x = latents.reshape(b, c, t, hh // p, p, ww // p, p)
        return x.permute(0, 2, 3, 5, 1, 4, 6).reshape(b, t * (hh // p) * (ww // p), c * p * p)

    def _unpatchify(self, tokens: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        b, c, t, hh, ww = shape
        p = self.config.patch_size
        x = tokens.reshape(b, t, hh // p, ww // p, c, p, p)
        return x.permute(0, 4, 1, 2, 5, 3, 6).reshape(b, c, t, hh, ww)

    def token_times(self, latent_frames: int, action_steps: int, patches_per_frame: int) -> torch.Tensor:
        """Time in seconds of every token, in :meth:`velocity`'s order (latent tokens, then actions)."""
        cfg = self.config
        lat = latent_times(latent_frames, cfg.fps, cfg.temporal_compression)
        return torch.cat([lat.repeat_interleave(patches_per_frame), action_times(action_steps, cfg.fps)])

    def velocity(self, latents: torch.Tensor, actions: torch.Tensor, t: torch.Tensor, batch: FlowBatch):
        """Predicted velocities ``(latents (B, C, T', H', W'), actions (B, Ta, 59))``.

        Args:
            latents: model input per latent frame: clean at condition frames, x_t at target frames.
            actions: model input per action step, likewise; invalid elements are zeroed here.
            t: (B,) flow time of each sample, in [0, 1].
            batch: gives the masks (and shapes); its clean values are not read here.
        """
        cfg = self.config
        tl, hh, ww = latents.shape[2:]
        ta = actions.shape[1]
        per_frame = (hh // cfg.patch_size) * (ww // cfg.patch_size)
        device = latents.device

        lat_tok = self.latent_in(self._patchify(latents))
        valid = batch.action_valid
        act_in = torch.where(valid, actions, torch.zeros((), dtype=actions.dtype, device=device))
        act_tok = self.action_in(torch.cat([act_in, valid.to(actions.dtype)], dim=-1))

        rows = torch.arange(hh // cfg.patch_size, device=device).repeat_interleave(ww // cfg.patch_size)
        cols = torch.arange(ww // cfg.patch_size, device=device).repeat(hh // cfg.patch_size)
        spatial = (self.row(rows) + self.col(cols)).repeat(tl, 1)
        lat_tok = lat_tok + spatial + self.kind.weight[0]
        act_tok = act_tok + self.kind.weight[1]
        x = torch.cat([lat_tok, act_tok], dim=1)

        # Time in frames of the video clock (seconds * fps): integer-spaced for the sinusoids.
        times = self.token_times(tl, ta, per_frame).to(device) * cfg.fps
        x = x + _sinusoid(times, cfg.d_model, max_period=1000.0).to(x.dtype)
        target = torch.cat(
            [batch.latent_target.repeat_interleave(per_frame, dim=1), batch.action_target], dim=1
        )
        condition = torch.cat(
            [batch.latent_condition.repeat_interleave(per_frame, dim=1), batch.action_condition], dim=1
        )
        x = x + self.role(target.long())
        attend = target | condition
        # A sample with no token at all would give rows of -inf: let it attend everywhere (unused).
        attend = attend | ~attend.any(dim=1, keepdim=True)

        cond = self.time_mlp(_sinusoid(t * 1000.0, cfg.d_model, max_period=10000.0).to(x.dtype))
        for block in self.blocks:
            x = block(x, cond, attend)
        x = self.norm_out(x)
        n_lat = tl * per_frame
        v_lat = self._unpatchify(self.latent_out(x[:, :n_lat]), latents.shape)
        v_act = self.action_out(x[:, n_lat:])
        return v_lat, v_act

    def loss(
        self,
        batch: FlowBatch,
        noise: tuple[torch.Tensor, torch.Tensor] | None = None,
        t: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> FlowLoss:
        """The flow-matching loss of one batch.

        Args:
            batch: clean data and masks (checked: ValueError names a bad field).
            noise: ``(latent noise, action noise)`` x0, shaped as the data; drawn when None.
            t: (B,) flow times; drawn uniformly in [0, 1) when None.
            generator: source of the drawn noise and times.
        """
        cfg = self.config
        batch.check(cfg)
        lat, act = batch.latents, torch.where(batch.action_valid, batch.actions, 0.0)
        b, device = lat.shape[0], lat.device
        if noise is None:
            noise = (
                torch.randn(lat.shape, generator=generator, dtype=lat.dtype, device=device),
                torch.randn(act.shape, generator=generator, dtype=act.dtype, device=device),
            )
        if t is None:
            t = torch.rand((b,), generator=generator, dtype=lat.dtype, device=device)
        n_lat, n_act = noise
        tl = t.view(b, 1, 1, 1, 1)
        ta = t.view(b, 1, 1)
        lat_t = (1 - tl) * n_lat + tl * lat
        act_t = (1 - ta) * n_act + ta * act
        lat_given = batch.latent_condition.view(b, 1, -1, 1, 1)
        act_given = batch.action_condition.unsqueeze(-1)
        v_lat, v_act = self.velocity(
            torch.where(lat_given, lat, lat_t), torch.where(act_given, act, act_t), t, batch
        )
        lat_mask = batch.latent_target.view(b, 1, -1, 1, 1).expand_as(lat)
        act_mask = batch.action_target.unsqueeze(-1) & batch.action_valid
        lat_loss = flow_matching_loss(v_lat, lat - n_lat, lat_mask)
        act_loss = flow_matching_loss(v_act, act - n_act, act_mask)
        lat_count, act_count = int(lat_mask.sum()), int(act_mask.sum())
        total = (lat_loss * lat_count + act_loss * act_count) / max(lat_count + act_count, 1)
        return FlowLoss(total, lat_loss, act_loss, lat_count, act_count)

    @torch.no_grad()
    def sample(
        self, batch: FlowBatch, steps: int = 16, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Generate the target tokens by Euler steps from noise; condition tokens stay as given.

        Returns:
            ``(latents, actions)`` shaped as the batch's; invalid action elements are 0.
        """
        if steps < 1:
            raise ValueError(f"steps={steps}: expected at least 1")
        batch.check(self.config)
        lat = batch.latents
        act = torch.where(batch.action_valid, batch.actions, 0.0)
        b = lat.shape[0]
        lat_given = batch.latent_condition.view(b, 1, -1, 1, 1)
        act_given = batch.action_condition.unsqueeze(-1)
        x_lat = torch.where(lat_given, lat, torch.randn(lat.shape, generator=generator).to(lat))
        x_act = torch.where(act_given, act, torch.randn(act.shape, generator=generator).to(act))
        for i in range(steps):
            t = torch.full((b,), i / steps, dtype=lat.dtype, device=lat.device)
            v_lat, v_act = self.velocity(x_lat, x_act, t, batch)
            x_lat = torch.where(lat_given, lat, x_lat + v_lat / steps)
            x_act = torch.where(act_given, act, x_act + v_act / steps)
        return x_lat, torch.where(batch.action_valid, x_act, 0.0)
