"""The fixed 59-dim action layout and its validity mask (docs: DESIGN.md, "The action layout").

Every source writes actions into the same 59 slots; a mask of the same shape says which slots
hold real values, so a field a source does not have is never mistaken for a real zero::

    [0:9]    ego camera/body: position (3) + 6D rotation (6)
    [9:19]   left wrist: position (3) + 6D rotation (6) + gripper opening (1)
    [19:34]  five left fingertip positions (5 x 3), in the left wrist frame
    [34:44]  right wrist, as the left
    [44:59]  five right fingertips, as the left

Losses are taken only over valid target elements (:func:`masked_mse`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from troupe.actors.lerobot.errors import InvalidData

__all__ = [
    "ACTION_DIM",
    "ACTION_NAMES",
    "EGO",
    "EGO_POSITION",
    "EGO_ROTATION",
    "LEFT_FINGERTIPS",
    "LEFT_GRIPPER",
    "LEFT_WRIST",
    "PARTS",
    "RIGHT_FINGERTIPS",
    "RIGHT_GRIPPER",
    "RIGHT_WRIST",
    "empty_actions",
    "masked_mse",
    "set_ego",
    "set_part",
]

ACTION_DIM = 59

EGO = slice(0, 9)
EGO_POSITION = slice(0, 3)
EGO_ROTATION = slice(3, 9)
LEFT_WRIST = slice(9, 19)
LEFT_GRIPPER = slice(18, 19)
LEFT_FINGERTIPS = slice(19, 34)
RIGHT_WRIST = slice(34, 44)
RIGHT_GRIPPER = slice(43, 44)
RIGHT_FINGERTIPS = slice(44, 59)

PARTS: dict[str, slice] = {
    "ego": EGO,
    "left_wrist": LEFT_WRIST,
    "left_fingertips": LEFT_FINGERTIPS,
    "right_wrist": RIGHT_WRIST,
    "right_fingertips": RIGHT_FINGERTIPS,
}
"""The five top-level parts, in order; together they tile [0:59] exactly."""


def _pose_names(prefix: str) -> list[str]:
    return [f"{prefix}.pos.{a}" for a in "xyz"] + [f"{prefix}.rot6d.{i}" for i in range(6)]


def _tip_names(side: str) -> list[str]:
    return [f"{side}_tip{t}.{a}" for t in range(5) for a in "xyz"]


ACTION_NAMES: list[str] = (
    _pose_names("ego")
    + _pose_names("left_wrist")
    + ["left_wrist.gripper"]
    + _tip_names("left")
    + _pose_names("right_wrist")
    + ["right_wrist.gripper"]
    + _tip_names("right")
)
"""One name per slot, e.g. ``ego.pos.x``, ``left_wrist.rot6d.3``, ``right_tip4.z``."""

assert len(ACTION_NAMES) == ACTION_DIM  # the layout is fixed; a typo above must not ship


def empty_actions(length: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """Return ``length`` steps of all-zero actions with an all-False validity mask.

    Args:
        length: number of time steps T (>= 0).

    Returns:
        ``(actions, mask)``: float32 (T, 59) and bool (T, 59).

    Raises:
        InvalidData: ``length`` is negative.
    """
    if length < 0:
        raise InvalidData(f"action length {length} is negative; pass the number of steps (>= 0)")
    return (
        np.zeros((length, ACTION_DIM), dtype=np.float32),
        np.zeros((length, ACTION_DIM), dtype=np.bool_),
    )


def set_part(
    actions: npt.NDArray[np.float32],
    mask: npt.NDArray[np.bool_],
    part: slice,
    values: npt.ArrayLike,
) -> None:
    """Write one part of the layout for every step, in place, and mark it valid.

    Args:
        actions: float32 (T, 59), as from :func:`empty_actions`.
        mask: bool (T, 59), the same shape.
        part: a slice of the layout, e.g. :data:`LEFT_WRIST`.
        values: (T, part width) finite numbers.

    Raises:
        InvalidData: shapes do not match or values are not finite.
    """
    if actions.shape != mask.shape or actions.ndim != 2 or actions.shape[1] != ACTION_DIM:
        raise InvalidData(
            f"actions {actions.shape} and mask {mask.shape} must both be (T, {ACTION_DIM}); "
            "build them with empty_actions(T)"
        )
    width = len(range(*part.indices(ACTION_DIM)))
    arr = np.asarray(values, dtype=np.float32)
    if arr.shape != (actions.shape[0], width):
        raise InvalidData(
            f"values {arr.shape} do not fit slots {part.start}:{part.stop}; "
            f"expected ({actions.shape[0]}, {width})"
        )
    if not np.isfinite(arr).all():
        raise InvalidData(
            f"values for slots {part.start}:{part.stop} hold NaN or inf; "
            "leave a missing field masked instead of writing a placeholder"
        )
    actions[:, part] = arr
    mask[:, part] = True


def set_ego(actions: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_], ego9: npt.ArrayLike) -> None:
    """Write the ego pose (position + 6D rotation, (T, 9)) into [0:9], in place, marked valid.

    Raises:
        InvalidData: see :func:`set_part`.
    """
    set_part(actions, mask, EGO, ego9)


def masked_mse(pred: npt.ArrayLike, target: npt.ArrayLike, mask: npt.ArrayLike) -> float:
    """Mean squared error over the valid target elements only.

    Masked-out targets may hold anything (NaN included): they never reach the sum.

    Args:
        pred: predictions, any shape.
        target: targets, the same shape.
        mask: bool validity of each target element, the same shape.

    Returns:
        The mean over valid elements, or 0.0 when no element is valid (the zero-denominator
        guard: an all-masked batch contributes no loss rather than NaN).

    Raises:
        InvalidData: the shapes differ.
    """
    p = np.asarray(pred, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    m = np.asarray(mask, dtype=np.bool_)
    if not (p.shape == t.shape == m.shape):
        raise InvalidData(f"pred {p.shape}, target {t.shape} and mask {m.shape} must have one shape")
    count = int(m.sum())
    if count == 0:
        return 0.0
    diff = p[m] - t[m]  # index first: inf - inf in a masked slot must not even be computed
    return float((diff * diff).sum() / count)
