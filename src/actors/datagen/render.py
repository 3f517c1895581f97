"""Glue between a Scene and Plan and the torch renderer (``troupe.models.raycast``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from troupe.models.camera import Intrinsics
from troupe.models.raycast import Lighting, render

from .scene import Scene, scene_boxes_tensor
from .trajectory import Plan

__all__ = ["render_plan"]


PIXELS_PER_CALL = 1 << 21
"""Pixels (frames x height x width) rendered per batched call: about 7 frames at 640x480, the
whole episode at small sizes. Frames are independent, so the split changes no pixel; it bounds
the time between two ``on_frames`` reports (a replica's liveness) and the working memory."""


def render_plan(
    scene: Scene,
    plan: Plan,
    device: str | torch.device | None = None,
    on_frames: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Render every frame of ``plan``, in batched calls of about PIXELS_PER_CALL pixels.

    Args:
        on_frames: called with the number of frames after each batched call.

    Returns:
        ``(rgb uint8 (T, H, W, 3), depth float32 (T, H, W))`` as numpy arrays on the host;
        depth is z-depth in metres, ``inf`` where a ray hits nothing.
    """
    r = scene.render
    bounds, colors, textures = scene_boxes_tensor(scene)
    n = len(plan.positions)
    step = max(1, PIXELS_PER_CALL // (r.width * r.height))
    rgb = np.empty((n, r.height, r.width, 3), dtype=np.uint8)
    depth = np.empty((n, r.height, r.width), dtype=np.float32)
    with torch.inference_mode():
        for f0 in range(0, n, step):
            f1 = min(f0 + step, n)
            rgb_t, depth_t = render(
                bounds,
                colors,
                textures,
                plan.positions[f0:f1],
                plan.rotations[f0:f1],
                intrinsics=Intrinsics.from_fov(r.width, r.height, r.fov_deg),
                lighting=Lighting(r.light_dir, r.light_intensity, r.ambient),
                device=device,
            )
            rgb[f0:f1] = rgb_t.cpu().numpy()
            depth[f0:f1] = depth_t.cpu().numpy()
            if on_frames is not None:
                on_frames(f1 - f0)
    return rgb, depth
