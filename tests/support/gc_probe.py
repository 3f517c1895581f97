"""An actor and a stage that say how their process's garbage collector stands.

Worker processes load them as ``support.gc_probe:GcProbe`` and ``support.gc_probe:FrozenStage``
(``tests/`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import gc
from typing import Any

from troupe.runtime.core.actor import Actor, handles
from troupe.runtime.pipeline.stage import StageActor

__all__ = ["FrozenStage", "GcProbe"]


class GcProbe(Actor):
    """``state``: whether collection is on, and how many objects it leaves alone (frozen)."""

    @handles("state")
    def state(self, _: Any) -> dict[str, Any]:
        return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}


class FrozenStage(StageActor):
    """A stage that says, in each output, how many objects its process leaves to the template
    it was forked from (frozen there; none in a spawned process)."""

    def process(self, item: Any) -> Any:
        return {**item, "frozen": gc.get_freeze_count()}
