"""A torch-using actor for the protocol client tests: its module imports torch, as such actors do."""

from __future__ import annotations

from typing import Any

import torch

from support.protocol_probe import ArrayProbe
from troupe.runtime import handles

__all__ = ["TensorProbe"]


class TensorProbe(ArrayProbe):
    """``ArrayProbe`` in a module that imports torch; ``tensor`` describes a received tensor."""

    @handles("tensor")
    def tensor(self, payload: Any) -> dict[str, Any]:
        return {"is_tensor": isinstance(payload, torch.Tensor), "sum": float(payload.sum())}
