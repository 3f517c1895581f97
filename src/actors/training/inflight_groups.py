"""A batch's video as the encoder actors get it: checked, cut into sample groups, encoded as
``EncoderActor`` encodes a group (in this process, for :func:`~.inflight.train_local`), or asked
of the encoder actors through troupe refs (the :data:`~.inflight_types.EncodeFn` of
:func:`~.inflight.train_remote`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from troupe.runtime import RemoteError

from .inflight_types import EncodeFn, SampleGroup

__all__ = ["actor_encoder", "encode_video", "split_groups", "video_of"]


def video_of(batch: Any, index: int) -> torch.Tensor:
    if not isinstance(batch, dict) or "video" not in batch:
        keys = sorted(map(str, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"batch {index}: expected a dict with 'video', got {keys}")
    video = batch["video"]
    if not isinstance(video, torch.Tensor) or video.ndim != 5:
        shape = tuple(video.shape) if isinstance(video, torch.Tensor) else type(video).__name__
        raise ValueError(f"batch {index}: 'video' must be a (B, C, T, H, W) tensor, got {shape}")
    return video


def split_groups(batch_index: int, video: torch.Tensor, group_size: int) -> list[SampleGroup]:
    """The batch's video cut along its first axis into groups of ``group_size`` samples."""
    return [
        SampleGroup(batch_index, i, chunk.contiguous())
        for i, chunk in enumerate(torch.split(video, group_size, dim=0))
    ]


def encode_video(module: nn.Module, video: torch.Tensor) -> torch.Tensor:
    """What ``EncoderActor`` computes for one group, in this process: uint8 frames mapped to
    [-1, 1], float ones taken as they are; the module's ``encode`` where it has one; float32."""
    x = video.float() / 127.5 - 1.0 if video.dtype == torch.uint8 else video.float()
    fn = getattr(module, "encode", None)
    with torch.no_grad():
        latents = fn(x) if callable(fn) else module(x)
    return latents.float().cpu()


def actor_encoder(
    runtime: Any, names: Sequence[str], params: dict[str, Any] | None = None, timeout: float | None = None
) -> EncodeFn:
    """The :data:`EncodeFn` that asks the encoder actors ``names`` through troupe refs.

    Args:
        runtime: a troupe runtime (``connect(...)``, or an actor's own).
        names: the encoder actors, in the order every rank uses.
        params: the preprocessing the trainer did (JSON data), part of the actors' cache key.
        timeout: seconds of one ask (the runtime's default when None); the pipeline's deadline
            bounds it too.
    """
    refs = [runtime.ref(name) for name in names]

    async def encode(index: int, group: SampleGroup) -> torch.Tensor:
        payload = {"tag": list(group.tag), "video": group.video, "params": params or {}}
        try:
            reply = await refs[index].ask("encode", payload, timeout=timeout)
        except RemoteError:
            raise
        except BaseException:
            # No answer: the actor may be started again on another node (its own died). A ref
            # keeps the node/process it resolved to, so the next ask resolves the name afresh.
            refs[index] = runtime.ref(names[index])
            raise
        if list(reply.get("tag") or ()) != list(group.tag):
            raise ValueError(f"encoder {names[index]!r} answered tag {reply.get('tag')!r} for {group.tag}")
        latents = reply["latents"]
        return latents if isinstance(latents, torch.Tensor) else torch.as_tensor(latents)

    return encode
