"""A training dataset whose actions are nan: the loss of the first step is nan (a run that
diverges at once, on every seed and machine)."""

from __future__ import annotations

from typing import Any

import torch

from troupe.actors.training.dataset import LeRobotClips

__all__ = ["NanClips"]


class NanClips(LeRobotClips):
    """``LeRobotClips`` with every action nan."""

    def read(self, i: int, source: Any, frame: int) -> dict[str, Any]:
        item = super().read(i, source, frame)
        item["actions"] = torch.full_like(item["actions"], float("nan"))
        return item
