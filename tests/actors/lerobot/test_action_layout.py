from __future__ import annotations

import numpy as np
import pytest

from troupe.actors.lerobot import action_layout as al
from troupe.actors.lerobot.errors import InvalidData


def test_parts_tile_the_layout() -> None:
    """The five parts cover slots 0..58 exactly once, in order, with one name per slot."""
    covered = [i for part in al.PARTS.values() for i in range(al.ACTION_DIM)[part]]
    assert covered == list(range(al.ACTION_DIM))
    assert len(al.ACTION_NAMES) == len(set(al.ACTION_NAMES)) == 59
    assert al.ACTION_NAMES[al.LEFT_GRIPPER.start] == "left_wrist.gripper"
    assert al.ACTION_NAMES[al.RIGHT_GRIPPER.start] == "right_wrist.gripper"
    assert al.ACTION_NAMES[19] == "left_tip0.x" and al.ACTION_NAMES[58] == "right_tip4.z"


def test_empty_actions_are_zero_and_invalid() -> None:
    """empty_actions gives float32 zeros and an all-False bool mask of shape (T, 59)."""
    actions, mask = al.empty_actions(4)
    assert actions.shape == mask.shape == (4, 59)
    assert actions.dtype == np.float32 and mask.dtype == np.bool_
    assert not actions.any() and not mask.any()
    with pytest.raises(InvalidData):
        al.empty_actions(-1)


def test_set_ego_fills_and_marks_only_ego() -> None:
    """set_ego writes [0:9] and marks exactly those slots valid."""
    actions, mask = al.empty_actions(3)
    ego = np.arange(27, dtype=np.float32).reshape(3, 9)
    al.set_ego(actions, mask, ego)
    np.testing.assert_array_equal(actions[:, :9], ego)
    assert mask[:, :9].all() and not mask[:, 9:].any()
    assert not actions[:, 9:].any()


def test_set_part_rejects_bad_shapes_and_nan() -> None:
    """Wrong widths, wrong lengths and NaN values raise InvalidData, a ValueError."""
    actions, mask = al.empty_actions(2)
    with pytest.raises(InvalidData, match="expected \\(2, 10\\)"):
        al.set_part(actions, mask, al.LEFT_WRIST, np.zeros((2, 9)))
    with pytest.raises(ValueError, match="NaN"):
        al.set_ego(actions, mask, np.full((2, 9), np.nan))
    with pytest.raises(InvalidData):
        al.set_ego(actions[:, :10], mask[:, :10], np.zeros((2, 9)))
    assert not mask.any()


def test_masked_mse_counts_only_valid_elements() -> None:
    """masked_mse averages squared error over valid elements and ignores masked NaN targets."""
    pred = np.array([[1.0, 2.0, 3.0]])
    target = np.array([[0.0, np.nan, np.inf]])
    mask = np.array([[True, False, False]])
    assert al.masked_mse(pred, target, mask) == pytest.approx(1.0)
    mask2 = np.array([[True, True, False]])
    target2 = np.array([[0.0, 0.0, np.inf]])
    assert al.masked_mse(pred, target2, mask2) == pytest.approx((1.0 + 4.0) / 2)


def test_masked_mse_zero_denominator_guard() -> None:
    """With no valid element the loss is 0.0, not NaN."""
    actions, mask = al.empty_actions(5)
    assert al.masked_mse(actions + 1.0, actions, mask) == 0.0
    with pytest.raises(InvalidData):
        al.masked_mse(np.zeros(3), np.zeros(4), np.ones(3, bool))
