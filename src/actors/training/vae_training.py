"""Train troupe's video VAE on clips of a LeRobot dataset (``troupe models train-vae``).

The loss is the VAE's own: mean squared reconstruction error of a reparameterised sample's
decoding, in [-1, 1] pixel units, plus ``kl_weight`` times the KL term :class:`VAEOutput`
gives. AdamW, everything seeded (weights, clip order, sampling noise), so the same data, config
and seed give the same weights on the same device. The last clips of the dataset (at most
:data:`MAX_HELD_OUT`, about a tenth) are held out: the figures compare their reconstruction
error before and after training.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from troupe.models.video_vae import VideoVAE, VideoVAEConfig

__all__ = ["DEFAULT_KL_WEIGHT", "MAX_HELD_OUT", "held_out_split", "recon_mse", "train_vae"]

DEFAULT_KL_WEIGHT = 1e-3
MAX_HELD_OUT = 32
_LOSS_WINDOW = 10  # steps each of first_loss and final_loss averages

Progress = Callable[[int, dict[str, float]], None]


def held_out_split(n: int) -> tuple[list[int], list[int]]:
    """(train, held-out) clip indices: the last ``min(MAX_HELD_OUT, n // 10)`` clips (at least
    one) are held out; a dataset of one clip trains and evaluates on it."""
    if n < 1:
        raise ValueError("train_vae: the dataset has no clips; generate data with `troupe run` first")
    held = max(1, min(MAX_HELD_OUT, n // 10))
    if n == 1:
        return [0], [0]
    return list(range(n - held)), list(range(n - held, n))


def _video(dataset: Any, indices: Sequence[int], device: torch.device) -> torch.Tensor:
    clips = torch.stack([dataset[int(i)]["video"] for i in indices])
    return clips.to(device).float() / 127.5 - 1.0


@torch.no_grad()
def recon_mse(vae: VideoVAE, dataset: Any, indices: Sequence[int], batch_size: int = 8) -> float:
    """Mean squared error (in [-1, 1] units) of decoding the posterior mean of each clip."""
    device = next(vae.parameters()).device
    was_training = vae.training
    vae.eval()
    total, count = 0.0, 0
    for lo in range(0, len(indices), batch_size):
        x = _video(dataset, indices[lo : lo + batch_size], device)
        total += F.mse_loss(vae(x).reconstruction, x, reduction="sum").item()
        count += x.numel()
    vae.train(was_training)
    return total / max(count, 1)


def train_vae(
    dataset: Any,
    config: VideoVAEConfig,
    steps: int,
    batch_size: int,
    lr: float = 1e-3,
    seed: int = 0,
    on_progress: Progress | None = None,
    kl_weight: float = DEFAULT_KL_WEIGHT,
    device: str | torch.device | None = None,
) -> tuple[VideoVAE, dict[str, Any]]:
    """Train a new :class:`VideoVAE` of ``config`` on ``dataset``'s clips.

    Args:
        dataset: clips as :class:`~troupe.actors.training.dataset.LeRobotClips` gives them
            (``item["video"]`` uint8 (3, T, H, W)); T and H, W must fit ``config``.
        config: the VAE's shape.
        steps: optimiser steps (> 0).
        batch_size: clips per step (> 0).
        lr: AdamW's learning rate.
        seed: seeds the initial weights, the clip order and the sampling noise.
        on_progress: called after each step with the step (1-based) and
            ``{"loss", "recon", "kl"}``.
        kl_weight: weight of the KL term.
        device: where to train; None: the GPU where there is one, else the CPU.

    Returns:
        The trained VAE (on the CPU, in eval mode) and its figures: ``final_loss`` (mean of the
        last 10 steps), ``first_loss`` (mean of the first 10; of a run under 20 steps, each
        mean takes half the steps, so that they never share one), ``recon_mse`` and
        ``recon_mse_untrained`` on the held-out clips, ``held_out``, ``clips``, ``steps``,
        ``seconds`` (training alone), ``device``.

    Raises:
        ValueError: a bad argument, or clips whose shape does not fit ``config`` (names both).
    """
    for name, value in (("steps", steps), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"train_vae {name}={value!r}: expected a positive integer")
    if not lr > 0:
        raise ValueError(f"train_vae lr={lr!r}: expected a positive number")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    train_idx, held_idx = held_out_split(len(dataset))
    shape = tuple(dataset[train_idx[0]]["video"].shape)
    try:
        config.latent_shape(*shape[1:])
    except ValueError as exc:
        raise ValueError(f"clips of shape {shape} do not fit the VAE config {config}: {exc}") from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = VideoVAE(config)
    vae.to(dev)
    untrained = recon_mse(vae, dataset, held_idx, batch_size)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=lr)
    order = torch.Generator().manual_seed(seed)
    noise = torch.Generator(device=dev).manual_seed(seed + 1)
    losses: list[float] = []
    vae.train()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        picks = torch.randint(len(train_idx), (batch_size,), generator=order).tolist()
        x = _video(dataset, [train_idx[p] for p in picks], dev)
        out = vae(x, sample=True, generator=noise)
        recon = F.mse_loss(out.reconstruction, x)
        loss = recon + kl_weight * out.kl
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if on_progress is not None:
            on_progress(step, {"loss": losses[-1], "recon": recon.item(), "kl": out.kl.item()})
    seconds = time.perf_counter() - start
    vae.eval()
    window = max(1, min(_LOSS_WINDOW, steps // 2))
    figures = {
        "steps": steps,
        "clips": len(dataset),
        "held_out": len(held_idx),
        "first_loss": sum(losses[:window]) / window,
        "final_loss": sum(losses[-window:]) / window,
        "recon_mse": recon_mse(vae, dataset, held_idx, batch_size),
        "recon_mse_untrained": untrained,
        "seconds": seconds,
        "device": dev.type,
    }
    return vae.cpu(), figures
