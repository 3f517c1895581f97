"""``troupe models``: train troupe's video VAE on a dataset, and show a checkpoint.

``troupe models train-vae DATA --out vae.pt`` trains on clips of DATA (a finalized LeRobot
dataset or a ``troupe run`` output folder), prints progress, then the figures (final loss,
held-out reconstruction error against the untrained VAE's, seconds), and writes the checkpoint
atomically (a temporary sibling renamed into place) with ``VideoVAE.save``. An existing
``--out`` is refused unless ``--force``. ``troupe models info PATH`` prints a checkpoint's config
and fingerprint.

Bad input is one line and exit status 2, before anything is trained or written (the checks are
in ``vae_checks``), and so is a batch larger than the training clips.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from troupe.cli.client import fail
from troupe.cli.literal import literal

from .vae_checks import (
    MAX_CHANNELS,
    MAX_LR,
    MAX_SIDE,
    MAX_THREADS,
    NotCheckpoint,
    check_fit,
    check_memory,
    check_numbers,
    check_out,
    check_room,
    load_checkpoint,
    no_room_note,
    tmp_path,
)

if TYPE_CHECKING:
    pass

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
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            min=1,
            help="Clips per step, drawn at random (with repeats) from the training clips; "
            "at most their number (a larger batch only repeats clips), else refused.",
        ),
    ] = 8,
    clip_frames: Annotated[int, typer.Option("--clip-frames", min=1, help="Frames per clip.")] = 8,
    size: Annotated[
        str | None,
        typer.Option(
            "--size", metavar="HxW", help=f"Resize frames, each side at most {MAX_SIDE} (default: as stored)."
        ),
    ] = None,
    stride: Annotated[
        int | None, typer.Option("--stride", min=1, help="Frames between clip starts (default: clip frames).")
    ] = None,
    lr: Annotated[
        float, typer.Option("--lr", help=f"AdamW learning rate, > 0 and at most {MAX_LR:g}.")
    ] = 1e-3,
    seed: Annotated[int, typer.Option("--seed", help="Seeds weights, clip order and noise.")] = 0,
    base_channels: Annotated[
        int, typer.Option("--base-channels", min=1, help=f"VAE width (at most {MAX_CHANNELS}).")
    ] = 16,
    latent_channels: Annotated[
        int, typer.Option("--latent-channels", min=1, help=f"Latent channels (at most {MAX_CHANNELS}).")
    ] = 4,
    spatial_compression: Annotated[
        int, typer.Option("--spatial-compression", help="Height and width divided by this (power of 2).")
    ] = 4,
    temporal_compression: Annotated[
        int, typer.Option("--temporal-compression", help="Time divided by this (1, 2 or 4).")
    ] = 2,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads", min=1, help=f"torch CPU threads, at most {MAX_THREADS} (default: torch's choice)."
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as one JSON object.")] = False,
) -> None:
    """Train troupe's video VAE on DATA's clips and write it to --out."""
    import torch

    from troupe.actors.training.dataset import LeRobotClips, NotEnoughEpisodes
    from troupe.actors.training.vae_training import held_out_split, train_vae
    from troupe.models.video_vae import VideoVAEConfig

    check_out(out, force)
    check_numbers(lr, seed, threads, base_channels, latent_channels)
    try:
        hw = parse_size(size) if size is not None else None
        if hw is not None and max(hw) > MAX_SIDE:
            raise ValueError(f"--size {size}: each side must be at most {MAX_SIDE}")
        config = VideoVAEConfig(
            latent_channels=latent_channels,
            base_channels=base_channels,
            spatial_compression=spatial_compression,
            temporal_compression=temporal_compression,
            frames=clip_frames,
        )
        if hw is not None:
            check_fit(config, clip_frames, hw)
            check_memory(config, batch_size, clip_frames, hw)
        dataset = LeRobotClips(data, clip_frames=clip_frames, size=hw, stride=stride)
        train_clips = len(held_out_split(len(dataset))[0])
        if batch_size > train_clips:
            raise ValueError(
                f"--batch-size {batch_size}: more than the {train_clips} clips DATA has for training "
                f"({len(dataset)} in all, some held out); pass at most {train_clips}, or a smaller "
                "--stride or --clip-frames for more clips"
            )
        if hw is None:  # the stored frame size: read one clip (training reads it first anyway)
            stored = tuple(dataset[0]["video"].shape[2:])
            check_fit(config, clip_frames, (stored[0], stored[1]))
            check_memory(config, batch_size, clip_frames, (stored[0], stored[1]))
        check_room(out, config)  # known before training; found after it, every step was lost
    except NotEnoughEpisodes as exc:
        raise fail(f"{exc}; generate more data or lower --clip-frames {clip_frames}", 2) from None
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    if threads is not None:
        torch.set_num_threads(threads)

    every = max(1, steps // 20)
    reached = [0]  # the last step done, for a stop's line

    def progress(step: int, values: dict[str, float]) -> None:
        reached[0] = step
        if not as_json and (step % every == 0 or step == steps):
            console.print(
                f"step {step}/{steps}  loss {values['loss']:.5f}  recon {values['recon']:.5f}",
                highlight=False,
            )

    if not as_json:
        console.print(
            literal(f"training on {len(dataset)} clips of {dataset.episodes} episodes in {data}"),
            highlight=False,
            soft_wrap=True,
        )
    try:
        vae, figures = train_vae(dataset, config, steps, batch_size, lr=lr, seed=seed, on_progress=progress)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    except KeyboardInterrupt:  # Ctrl-C: said, as every stopped command says what it left
        Console(stderr=True).print(
            f"stopped at step {reached[0]}/{steps}: nothing written (--out is written once, at the "
            "end); the same command trains again from the start",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(130) from None
    tmp = tmp_path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        vae.save(tmp)
        os.replace(tmp, out)
    except (OSError, RuntimeError) as exc:  # checked before training; changed since, or disk full
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise fail(
            f"--out {out}: could not write the checkpoint ({first}){no_room_note(out, exc)}", 1
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    figures = {**figures, "out": str(out), "fingerprint": vae.fingerprint(), "bytes": out.stat().st_size}
    if as_json:
        typer.echo(json.dumps(figures, sort_keys=True))
        return
    _print_figures(figures)
    console.print(literal(f"wrote {out} ({figures['bytes']} bytes)"), highlight=False, soft_wrap=True)


@models_app.command("info")
def info(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="A checkpoint VideoVAE.save wrote.")],
) -> None:
    """Print a VAE checkpoint's config and fingerprint."""
    try:
        vae = load_checkpoint(path)
    except NotCheckpoint as exc:
        raise fail(f"PATH {path}: {exc}", 2) from None
    for key, value in vae.config.__dict__.items():  # the checkpoint file's: text, not markup
        console.print(literal(f"{key} = {value}"), highlight=False)
    params = sum(p.numel() for p in vae.parameters())
    console.print(f"parameters = {params}", highlight=False)
    console.print(f"fingerprint = {vae.fingerprint()}", highlight=False)
