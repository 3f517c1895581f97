"""The errors of data generation: an item whose trajectory cannot be planned."""

from __future__ import annotations

from troupe.runtime.errors import ItemFailed

__all__ = ["PlanFailed"]


class PlanFailed(ItemFailed):
    """No usable trajectory for this item: goal unreachable, path too short, no free cells."""

    code = "plan_failed"
