"""What ``troupe models train-vae`` and ``troupe models info`` check before they start: each
failure is one line and exit status 2, before anything is trained or written.

train-vae: an ``--out`` whose folder cannot hold it (a file on the way, /proc, /sys, /dev, no
write permission), a learning rate that is not finite or outside (0, 10], a seed torch cannot
take, a ``--size`` side past :data:`MAX_SIDE`, a model and batch whose training could not fit in
the memory of the device it would run on (computed from the numbers: a lower bound), a disk
without room for the checkpoint (its size is known from the model's parameters: it trained every
step, then failed to write it). info: why a
file is not a checkpoint (empty, not loadable without running code, not the content
``VideoVAE.save`` writes); it is read with weights only, so no code in it runs.
"""

from __future__ import annotations

import errno
import math
import os
import pickle
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from troupe.cli.client import fail
from troupe.cli.preflight import writable_problem

if TYPE_CHECKING:
    from troupe.models.video_vae import VideoVAE, VideoVAEConfig

__all__ = [
    "MAX_CHANNELS",
    "MAX_LR",
    "MAX_SIDE",
    "MAX_THREADS",
    "NotCheckpoint",
    "check_fit",
    "check_memory",
    "check_numbers",
    "check_out",
    "check_room",
    "checkpoint_bytes",
    "device_memory",
    "load_checkpoint",
    "no_room_note",
    "tmp_path",
]

MAX_LR = 10.0
"""Learning rates above this only make the weights diverge (the default is 1e-3)."""
MAX_SIDE = 4096
"""Largest ``--size`` side: a clip this big already needs tens of GiB to train on."""
MAX_CHANNELS = 4096
"""Largest ``--base-channels`` / ``--latent-channels`` (the deepest level is 4x as wide)."""
MAX_THREADS = 1024
"""Largest ``--threads``: far more than torch can use; huge counts crash torch's thread pool."""
_SEEDS = (-(2**63), 2**64 - 2)  # what torch.manual_seed takes; training also seeds seed + 1
_GIB = 2**30


# --- train-vae's checks: each raises the one-line failure (exit 2) before anything is trained ---


def tmp_path(out: Path) -> Path:
    """The temporary sibling the checkpoint is written to before it is renamed to ``out``."""
    return out.with_name(f".{out.name}.{os.getpid()}.tmp")


def check_out(out: Path, force: bool) -> None:
    """``--out``'s folder exists or can be made, is writable and no kernel file system; ``out``
    is no directory, is new (or ``force``), and its temporary sibling's name is not too long."""
    problem = writable_problem(out.parent, "folder")
    if problem is not None:
        raise fail(f"--out {out}: {problem}", 2)
    if out.is_dir():
        raise fail(f"--out {out}: is a directory; give a file path such as vae.pt", 2)
    if out.exists() and not force:
        raise fail(f"--out {out}: already exists; pass --force to overwrite it", 2)
    existing = Path(os.path.abspath(out.parent))
    while not existing.exists():
        existing = existing.parent
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    longest = max(len(os.fsencode(out.name)), len(os.fsencode(tmp_path(out).name)))
    if longest > name_max:
        raise fail(
            f"--out {out}: the file name is too long (at most {name_max} bytes, with room for '.tmp')", 2
        )


def check_numbers(
    lr: float, seed: int, threads: int | None, base_channels: int, latent_channels: int
) -> None:
    """The numeric options that have no sane value past a bound (the bound is in the message)."""
    if not (math.isfinite(lr) and 0 < lr <= MAX_LR):
        raise fail(f"--lr {lr}: expected a finite learning rate > 0 and at most {MAX_LR:g}", 2)
    if not _SEEDS[0] <= seed <= _SEEDS[1]:
        raise fail(
            f"--seed {seed}: expected an integer from {_SEEDS[0]} to {_SEEDS[1]} (what torch takes)", 2
        )
    if threads is not None and threads > MAX_THREADS:
        raise fail(f"--threads {threads}: expected at most {MAX_THREADS}", 2)
    for option, value in (("--base-channels", base_channels), ("--latent-channels", latent_channels)):
        if value > MAX_CHANNELS:
            raise fail(f"{option} {value}: expected at most {MAX_CHANNELS}", 2)


def check_fit(config: VideoVAEConfig, frames: int, hw: tuple[int, int]) -> None:
    """Clips of ``frames`` x ``hw`` fit ``config`` (ValueError naming the option otherwise)."""
    try:
        config.latent_shape(frames, *hw)
    except ValueError as exc:
        raise ValueError(
            f"clips of {frames} frames of {hw[0]}x{hw[1]} do not fit the VAE ({exc}); "
            "change --size, --clip-frames, --spatial-compression or --temporal-compression"
        ) from None


def _training_bytes(config: VideoVAEConfig, batch_size: int, hw: tuple[int, int]) -> int:
    """A lower bound of the memory one training step of ``config`` on a batch takes.

    The weights with their gradients and AdamW's two moments (16 bytes a parameter, counted on
    a model built on the meta device: nothing allocated), plus the float32 tensors alive at full
    resolution when the loss is taken: the batch and its reconstruction (3 channels each) and
    the first encoder and last decoder activations (``base_channels`` each). The real peak is
    several times this; a batch over it clearly cannot train.
    """
    import torch

    from troupe.models.video_vae import VideoVAE

    with torch.device("meta"):
        params = sum(p.numel() for p in VideoVAE(config).parameters())
    voxels = batch_size * config.frames * hw[0] * hw[1]
    return 16 * params + 4 * voxels * (2 * config.in_channels + 2 * config.base_channels)


def device_memory() -> tuple[int, str]:
    """Total memory of the device :func:`train_vae` trains on (the GPU where there is one), and
    its name."""
    import psutil
    import torch

    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory, f"GPU {index}"
    return psutil.virtual_memory().total, "this machine"


def check_memory(config: VideoVAEConfig, batch_size: int, frames: int, hw: tuple[int, int]) -> None:
    """ValueError when a training step clearly cannot fit in the device's memory."""
    need = _training_bytes(config, batch_size, hw)
    have, where = device_memory()
    if need > have:
        raise ValueError(
            f"training on {batch_size} clips of {frames} frames of {hw[0]}x{hw[1]} with "
            f"--base-channels {config.base_channels} needs at least {need / _GIB:,.1f} GiB, more than "
            f"the {have / _GIB:,.1f} GiB of {where}; lower --size, --batch-size, --clip-frames "
            "or --base-channels"
        )


_SAVE_OVERHEAD = 64 << 10  # torch.save's zip: the config, the pickled index, per-file headers
_PER_TENSOR = 1 << 10  # each tensor's record and its 64-byte alignment, generously


def checkpoint_bytes(config: VideoVAEConfig) -> int:
    """About what ``VideoVAE.save`` writes for ``config``: its parameters' bytes (counted on the
    meta device: nothing is allocated) and the file's overhead, rounded up."""
    import torch

    from troupe.models.video_vae import VideoVAE

    with torch.device("meta"):
        state = VideoVAE(config).state_dict()
    return sum(t.numel() * t.element_size() + _PER_TENSOR for t in state.values()) + _SAVE_OVERHEAD


def _free(out: Path) -> int | None:
    existing = Path(os.path.abspath(out.parent))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return shutil.disk_usage(existing).free
    except OSError:
        return None


def check_room(out: Path, config: VideoVAEConfig) -> None:
    """ValueError when the disk that would hold ``out`` has less free than the checkpoint needs
    (it and its temporary sibling are not there at once: written, then renamed)."""
    need, free = checkpoint_bytes(config), _free(out)
    if free is not None and free < need:
        raise ValueError(
            f"--out {out}: the disk holding it has {free / 2**20:.2f} MiB free, less than the "
            f"{need / 2**20:.2f} MiB the checkpoint takes; free space there or give another --out"
        )


def no_room_note(out: Path, exc: BaseException) -> str:
    """``; the disk holding it is full (N MiB free)`` where writing ``out`` failed for want of
    space (ENOSPC, or torch's ``unexpected pos`` with little left), else ""."""
    free = _free(out)
    no_space = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
    full = no_space or (free is not None and free < 1 << 20)  # torch says it as "unexpected pos"
    if not full:
        return ""
    shown = "" if free is None else f" ({free / 2**20:.2f} MiB free)"
    return f"; the disk holding it is full{shown}: free space there or give another --out"


# --- info: a checkpoint read with weights only, checked before a model is built from it ---


class NotCheckpoint(Exception):
    """Why a file is not a checkpoint ``VideoVAE.save`` wrote (the message is the reason)."""


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        keys = sorted(map(str, value))
        shown = ", ".join(repr(k) for k in keys[:4]) + (", ..." if len(keys) > 4 else "")
        return f"a dict with keys {shown}" if keys else "an empty dict"
    return f"a {type(value).__name__}"


def load_checkpoint(path: Path) -> VideoVAE:
    """The VAE in ``path``, read as :meth:`VideoVAE.load` reads it (weights only: no code runs).

    Raises:
        NotCheckpoint: the file is missing, empty, not loadable safely, or holds anything but
            the ``{"config", "state_dict"}`` dict ``VideoVAE.save`` writes, with weights that fit.
    """
    import torch

    from troupe.models.video_vae import VideoVAE, VideoVAEConfig, non_finite

    not_vae = "not a troupe VAE checkpoint"
    try:
        if not path.exists():
            raise NotCheckpoint("no such file")
        if path.is_dir():
            raise NotCheckpoint("is a directory, not a checkpoint file")
        if not path.is_file():
            raise NotCheckpoint(f"{not_vae}: not a regular file")
        if path.stat().st_size == 0:
            with path.open("rb") as file:  # a /proc file says 0 bytes and has some
                if not file.read(1):
                    raise NotCheckpoint(f"{not_vae}: the file is empty (0 bytes)")
        with warnings.catch_warnings():  # torch warns on stderr about odd pickles: one line only
            warnings.simplefilter("ignore")
            blob = torch.load(path, map_location="cpu", weights_only=True)
    except NotCheckpoint:
        raise
    except OSError as exc:
        raise NotCheckpoint(f"cannot read it ({exc.strerror or type(exc).__name__})") from None
    except Exception as exc:  # whatever bytes the file holds; torch's advice is not passed on
        why = {
            pickle.UnpicklingError: "not a torch file, or it holds objects other than tensors and plain data",
            EOFError: "it ends too early",
            RuntimeError: "not a torch archive, or a damaged one",
        }.get(type(exc), f"not a torch file: {type(exc).__name__}")
        raise NotCheckpoint(f"{not_vae}: not a file torch can load safely, weights only ({why})") from None
    if not (isinstance(blob, dict) and {"config", "state_dict"} <= blob.keys()):
        expected = "the dict of 'config' and 'state_dict' VideoVAE.save writes"
        raise NotCheckpoint(f"{not_vae}: it holds {_describe(blob)}, not {expected}")
    if not isinstance(blob["config"], dict):
        raise NotCheckpoint(f"{not_vae}: its 'config' is {_describe(blob['config'])}, not a dict")
    if not (
        isinstance(blob["state_dict"], dict)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in blob["state_dict"].items())
    ):
        raise NotCheckpoint(
            f"{not_vae}: its 'state_dict' is {_describe(blob['state_dict'])}, not a dict of tensors"
        )
    weights: dict[str, torch.Tensor] = blob["state_dict"]
    try:
        config = VideoVAEConfig(**blob["config"])
        with torch.device("meta"):  # the shapes the config gives, nothing allocated
            shapes = {k: tuple(v.shape) for k, v in VideoVAE(config).state_dict().items()}
    except Exception as exc:  # unknown keys, bad values, sizes torch cannot even describe
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise NotCheckpoint(f"{not_vae}: its config is not a VAE's ({first})") from None
    missing = sorted(shapes.keys() - weights.keys())
    extra = sorted(weights.keys() - shapes.keys())
    wrong = [k for k in sorted(shapes.keys() & weights.keys()) if tuple(weights[k].shape) != shapes[k]]
    if missing or extra or wrong:
        found = [f"{len(missing)} missing (e.g. {missing[0]})"] if missing else []
        found += [f"{len(extra)} unexpected (e.g. {extra[0]})"] if extra else []
        if wrong:
            k = wrong[0]
            found.append(
                f"{len(wrong)} of another shape (e.g. {k}: {tuple(weights[k].shape)}, not {shapes[k]})"
            )
        raise NotCheckpoint(f"{not_vae}: its weights do not fit its config: {'; '.join(found)}")
    bad = non_finite(weights)
    if bad:
        raise NotCheckpoint(
            f"{len(bad)} weight tensor(s) hold nan or inf (e.g. {bad[0]}): saved from a training that "
            "diverged, or damaged; every latent would be nan"
        )
    vae = VideoVAE(config)
    vae.load_state_dict(weights)
    return vae
