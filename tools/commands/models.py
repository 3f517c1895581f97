"""``troupe models``: train troupe's video VAE on a dataset, and show a checkpoint.

``troupe models train-vae DATA --out vae.pt`` trains on clips of DATA (a finalized LeRobot
dataset or a ``troupe run`` output folder), prints progress, then the figures (final loss,
held-out reconstruction error against the untrained VAE's, seconds), and writes the checkpoint
atomically (a temporary sibling renamed into place) with ``VideoVAE.save``. An existing
``--out`` is refused unless ``--force``. ``troupe models info PATH`` prints a checkpoint's config
and fingerprint.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from troupe.cli.client import fail

__all__ = ["models_app", "parse_size"]

models_app = typer.Typer(no_args_is_help=True)
console = Console()


@models_app.callback()
def _models() -> None:
    """Train and inspect troupe's models (the video VAE)."""


def parse_size(text: str) -> tuple[int, int]:
    """``"64x48"`` -> ``(64, 48)`` (height x width).

    Raises:
        ValueError: not HxW with positive integers.
    """
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise ValueError(f"--size {text!r}: expected HxW, e.g. 64x64")
    return int(match[1]), int(match[2])


def _print_figures(figures: dict[str, Any]) -> None:
    console.print(
        f"final loss {figures['final_loss']:.5f} (first steps {figures['first_loss']:.5f}); "
        f"held-out recon MSE {figures['recon_mse']:.5f} vs {figures['recon_mse_untrained']:.5f} "
        f"untrained ({figures['held_out']} of {figures['clips']} clips); "
        f"{figures['steps']} steps in {figures['seconds']:.1f} s on {figures['device']}",
        highlight=False,
        soft_wrap=True,
    )


@models_app.command("train-vae")
def train_vae_command(
    data: Annotated[
        Path, typer.Argument(metavar="DATA", help="A LeRobot dataset or a `troupe run --out` folder.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="The checkpoint file to write.")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimiser steps.")] = 300,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Clips per step.")] = 8,
    clip_frames: Annotated[int, typer.Option("--clip-frames", min=1, help="Frames per clip.")] = 8,
    size: Annotated[
        str | None, typer.Option("--size", metavar="HxW", help="Resize frames (default: as stored).")
    ] = None,
    stride: Annotated[
        int | None, typer.Option("--stride", min=1, help="Frames between clip starts (default: clip frames).")
    ] = None,
    lr: Annotated[float, typer.Option("--lr", min=0.0, help="AdamW learning rate.")] = 1e-3,
    seed: Annotated[int, typer.Option("--seed", help="Seeds weights, clip order and noise.")] = 0,
    base_channels: Annotated[int, typer.Option("--base-channels", min=1, help="VAE width.")] = 16,
    latent_channels: Annotated[int, typer.Option("--latent-channels", min=1, help="Latent channels.")] = 4,
    spatial_compression: Annotated[
        int, typer.Option("--spatial-compression", help="Height and width divided by this (power of 2).")
    ] = 4,
    temporal_compression: Annotated[
        int, typer.Option("--temporal-compression", help="Time divided by this (1, 2 or 4).")
    ] = 2,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="torch CPU threads (default: torch's choice).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as one JSON object.")] = False,
) -> None:
    """Train troupe's video VAE on DATA's clips and write it to --out."""
    import torch

    from troupe.actors.training.dataset import LeRobotClips, NotEnoughEpisodes
    from troupe.actors.training.vae_training import train_vae
    from troupe.models.video_vae import VideoVAEConfig

    if out.exists() and not force:
        raise fail(f"--out {out}: already exists; pass --force to overwrite it", 2)
    if out.is_dir():
        raise fail(f"--out {out}: is a directory; give a file path such as vae.pt", 2)
    try:
        hw = parse_size(size) if size is not None else None
        config = VideoVAEConfig(
            latent_channels=latent_channels,
            base_channels=base_channels,
            spatial_compression=spatial_compression,
            temporal_compression=temporal_compression,
            frames=clip_frames,
        )
        dataset = LeRobotClips(data, clip_frames=clip_frames, size=hw, stride=stride)
    except NotEnoughEpisodes as exc:
        raise fail(f"{exc}; generate more data or lower --clip-frames {clip_frames}", 2) from None
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    if threads is not None:
        torch.set_num_threads(threads)

    every = max(1, steps // 20)

    def progress(step: int, values: dict[str, float]) -> None:
        if not as_json and (step % every == 0 or step == steps):
            console.print(
                f"step {step}/{steps}  loss {values['loss']:.5f}  recon {values['recon']:.5f}",
                highlight=False,
            )

    if not as_json:
        console.print(
            f"training on {len(dataset)} clips of {dataset.episodes} episodes in {escape(str(data))}",
            highlight=False,
            soft_wrap=True,
        )
    try:
        vae, figures = train_vae(dataset, config, steps, batch_size, lr=lr, seed=seed, on_progress=progress)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        vae.save(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    figures = {**figures, "out": str(out), "fingerprint": vae.fingerprint(), "bytes": out.stat().st_size}
    if as_json:
        typer.echo(json.dumps(figures, sort_keys=True))
        return
    _print_figures(figures)
    console.print(f"wrote {escape(str(out))} ({figures['bytes']} bytes)", highlight=False, soft_wrap=True)


@models_app.command("info")
def info(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="A checkpoint VideoVAE.save wrote.")],
) -> None:
    """Print a VAE checkpoint's config and fingerprint."""
    from troupe.models.video_vae import VideoVAE

    try:
        vae = VideoVAE.load(path)
    except (OSError, RuntimeError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise fail(f"PATH {path}: not a VideoVAE checkpoint ({first})", 2) from None
    for key, value in vae.config.__dict__.items():
        console.print(f"{key} = {value}", highlight=False)
    params = sum(p.numel() for p in vae.parameters())
    console.print(f"parameters = {params}", highlight=False)
    console.print(f"fingerprint = {vae.fingerprint()}", highlight=False)
