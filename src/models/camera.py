"""Pinhole cameras: intrinsics and ray generation.

Convention (shared with ``troupe.actors.datagen.pose``): a camera's rotation matrix maps camera axes to
world axes; its columns are the camera's forward, left and up directions in the world. Pixel
``(row v, column u)`` has its centre at ``(u + 0.5, v + 0.5)``; image x grows to the right
(the camera's -left) and image y grows downwards (the camera's -up).

Ray directions are *not* unit vectors: their component along the optical axis is exactly 1,
so the ray parameter ``t`` of a hit is its z-depth (distance along the optical axis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Intrinsics", "camera_rays", "pixel_directions"]


@dataclass(frozen=True)
class Intrinsics:
    """Pinhole intrinsics in pixels.

    Attributes:
        width: image width.
        height: image height.
        fx: focal length along image x.
        fy: focal length along image y.
        cx: principal point x (``width / 2`` for a centred camera).
        cy: principal point y.
    """

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1 or self.fx <= 0 or self.fy <= 0:
            raise ValueError(f"intrinsics need a positive size and focal lengths: {self}")

    @classmethod
    def from_fov(cls, width: int, height: int, fov_deg: float) -> Intrinsics:
        """Centred camera with square pixels and the given *horizontal* field of view.

        Raises:
            ValueError: ``fov_deg`` is not in (0, 180).
        """
        if not 0 < fov_deg < 180:
            raise ValueError(f"horizontal fov must be in (0, 180) degrees, got {fov_deg}")
        f = (width / 2) / math.tan(math.radians(fov_deg) / 2)
        return cls(width, height, f, f, width / 2, height / 2)


def pixel_directions(
    intrinsics: Intrinsics, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Ray directions in the camera frame ``(forward, left, up)``, forward component 1.

    Returns:
        ``(H, W, 3)`` tensor.
    """
    k = intrinsics
    u = (torch.arange(k.width, device=device, dtype=torch.float64) + 0.5 - k.cx) / k.fx
    v = (torch.arange(k.height, device=device, dtype=torch.float64) + 0.5 - k.cy) / k.fy
    vv, uu = torch.meshgrid(v, u, indexing="ij")
    return torch.stack([torch.ones_like(uu), -uu, -vv], dim=-1).to(dtype)


def camera_rays(intrinsics: Intrinsics, rotations: torch.Tensor) -> torch.Tensor:
    """World-frame ray directions for a batch of camera rotations.

    Each world direction is a sum of the rotation's columns weighted by the camera-frame
    components, written out element by element rather than as a batched matmul, so that a
    frame's rays do not depend on how many frames share the call.

    Args:
        intrinsics: the camera.
        rotations: ``(T, 3, 3)`` camera-to-world rotations.

    Returns:
        ``(T, H, W, 3)`` directions, forward component 1, on ``rotations``' device and dtype.
    """
    if rotations.ndim != 3 or rotations.shape[1:] != (3, 3):
        raise ValueError(f"rotations must have shape (T, 3, 3), got {tuple(rotations.shape)}")
    d = pixel_directions(intrinsics, rotations.device, rotations.dtype)
    r = rotations[:, None, None, :, :]  # (T, 1, 1, 3, 3)
    return (
        r[..., :, 0] * d[None, ..., 0:1] + r[..., :, 1] * d[None, ..., 1:2] + r[..., :, 2] * d[None, ..., 2:3]
    )
