"""Camera rotations and the 9-dim ego action.

Frames: the world is z-up. A camera's rotation matrix maps camera axes to world axes, and its
columns are, in order, the camera's *forward*, *left* and *up* directions in the world (the
x-forward, y-left, z-up body convention). ``troupe.models.camera`` casts rays with the same
convention. Yaw turns about world z, counter-clockwise from +x; positive pitch looks up.

The 6D rotation is the first two columns of the matrix, column after column
(``[R00, R10, R20, R01, R11, R21]``: forward, then left), the continuous representation of
Zhou et al. (2019). The ego action is ``position (3) + 6D rotation (6)``, the ``[0:9]`` slice of
the 59-dim action layout.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "ego_action",
    "rotation_from_6d",
    "rotation_from_yaw_pitch",
    "rotation_to_6d",
]

FloatArray = npt.NDArray[np.float64]


def rotation_from_yaw_pitch(yaw: float | npt.ArrayLike, pitch: float | npt.ArrayLike = 0.0) -> FloatArray:
    """Camera-to-world rotation for a yaw and a pitch, in radians.

    Args:
        yaw: heading about world z, counter-clockwise from +x; a scalar or an array of shape (T,).
        pitch: elevation of the optical axis, positive up; broadcast against ``yaw``.

    Returns:
        ``(3, 3)`` for scalars, ``(T, 3, 3)`` for arrays; columns are forward, left, up.
    """
    yaw_a, pitch_a = np.broadcast_arrays(np.asarray(yaw, np.float64), np.asarray(pitch, np.float64))
    cy, sy = np.cos(yaw_a), np.sin(yaw_a)
    cp, sp = np.cos(pitch_a), np.sin(pitch_a)
    zero = np.zeros_like(cy)
    forward = np.stack([cy * cp, sy * cp, sp], axis=-1)
    left = np.stack([-sy, cy, zero], axis=-1)
    up = np.stack([-cy * sp, -sy * sp, cp], axis=-1)
    return np.stack([forward, left, up], axis=-1)


def rotation_to_6d(rotation: npt.ArrayLike) -> FloatArray:
    """First two columns of a rotation matrix, column after column.

    Args:
        rotation: ``(..., 3, 3)`` rotation matrices.

    Returns:
        ``(..., 6)``: forward column then left column.
    """
    r = np.asarray(rotation, np.float64)
    if r.shape[-2:] != (3, 3):
        raise ValueError(f"rotation must have shape (..., 3, 3), got {r.shape}")
    return np.concatenate([r[..., :, 0], r[..., :, 1]], axis=-1)


def rotation_from_6d(six: npt.ArrayLike) -> FloatArray:
    """Rotation matrix back from a 6D rotation, by Gram-Schmidt.

    Args:
        six: ``(..., 6)`` as written by :func:`rotation_to_6d` (need not be exactly orthonormal,
            e.g. a network's output).

    Returns:
        ``(..., 3, 3)`` proper rotation matrices.
    """
    s = np.asarray(six, np.float64)
    if s.shape[-1] != 6:
        raise ValueError(f"a 6D rotation has 6 values in its last axis, got shape {s.shape}")
    a, b = s[..., :3], s[..., 3:]
    c0 = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b - np.sum(c0 * b, axis=-1, keepdims=True) * c0
    c1 = b / np.linalg.norm(b, axis=-1, keepdims=True)
    c2 = np.cross(c0, c1)
    return np.stack([c0, c1, c2], axis=-1)


def ego_action(position: npt.ArrayLike, rotation: npt.ArrayLike) -> FloatArray:
    """The 9-dim ego action: position followed by the 6D rotation.

    Args:
        position: ``(3,)`` or ``(T, 3)`` camera positions in metres, world frame.
        rotation: ``(3, 3)`` or ``(T, 3, 3)`` camera-to-world rotations.

    Returns:
        ``(9,)`` or ``(T, 9)`` float64.
    """
    p = np.asarray(position, np.float64)
    if p.shape[-1] != 3:
        raise ValueError(f"position must have shape (..., 3), got {p.shape}")
    return np.concatenate([p, rotation_to_6d(rotation)], axis=-1)
