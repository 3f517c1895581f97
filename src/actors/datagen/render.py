"""Glue between a Scene and Plan and the torch renderer (``troupe.models.raycast``)."""

from __future__ import annotations

import numpy as np
import torch

from troupe.models.camera import Intrinsics
from troupe.models.raycast import Lighting, render

from .scene import Scene, scene_boxes_tensor
from .trajectory import Plan

__all__ = ["render_plan"]


def render_plan(
    scene: Scene, plan: Plan, device: str | torch.device | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Render every frame of ``plan`` in one batched call.

    Returns:
        ``(rgb uint8 (T, H, W, 3), depth float32 (T, H, W))`` as numpy arrays on the host;
        depth is z-depth in metres, ``inf`` where a ray hits nothing.
    """
    r = scene.render
    bounds, colors, textures = scene_boxes_tensor(scene)
    with torch.inference_mode():
        rgb, depth = render(
            bounds,
            colors,
            textures,
            plan.positions,
            plan.rotations,
            intrinsics=Intrinsics.from_fov(r.width, r.height, r.fov_deg),
            lighting=Lighting(r.light_dir, r.light_intensity, r.ambient),
            device=device,
        )
    return rgb.cpu().numpy(), depth.cpu().numpy()
