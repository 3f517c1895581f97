"""The world model a training config names, refused before anything starts where its training
state alone cannot fit in the memory of the device it trains on. A ``[model]`` far too large
(``d_model = 8192``, ``layers = 64``) was taken: the rank grew to 14 GB on a 24 GB machine with
no word, the first Ctrl-C waited on it, and the host neared its OOM killer."""

from __future__ import annotations

from typing import Any

from .vae_checks import device_memory

__all__ = ["world_model_bytes", "world_model_problem"]

_GIB = float(1 << 30)


def world_model_bytes(cfg: Any) -> int:
    """A lower bound of one rank's training state: the weights, their gradients and AdamW's
    two moments, 16 bytes a parameter, counted on a model built on the meta device (nothing is
    allocated). Activations come on top."""
    import torch

    from troupe.models.world_model import WorldModel

    with torch.device("meta"):
        params = sum(p.numel() for p in WorldModel(cfg.world_model()).parameters())
    return 16 * params


def world_model_problem(cfg: Any) -> str | None:
    """Why the ranks cannot train ``cfg``'s model on this machine's device, or None."""
    need = world_model_bytes(cfg)
    have, where = device_memory()
    if need <= have:
        return None
    model = cfg.world_model()
    return (
        f"[model] d_model = {model.d_model}, layers = {model.layers}: a rank's weights, gradients and "
        f"optimizer state alone need {need / _GIB:,.1f} GiB, more than the {have / _GIB:,.1f} GiB of "
        f"{where}; make [model] smaller"
    )
