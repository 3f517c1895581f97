"""Actors for the light template's tests: ``Plain`` preloads nothing; ``Heavy`` preloads
``support.gated_import``, whose import waits for a gate (a stand-in for torch). Each says
whether its process has that module; so do the stages ``PlainStage`` and ``HeavyStage``, in the
item they pass on."""

from __future__ import annotations

import os
import sys
from typing import Any

from troupe.runtime import Actor, handles
from troupe.runtime.pipeline.stage import StageActor

__all__ = ["Heavy", "HeavyStage", "Plain", "PlainStage"]

GATED = "support.gated_import"


class Plain(Actor):
    @handles("where")
    def where(self, _: Any) -> dict[str, Any]:
        return {"gated": GATED in sys.modules, "ppid": os.getppid()}


class Heavy(Plain):
    preload_modules = (GATED,)


class PlainStage(StageActor):
    """Adds ``{stage name}_gated``: whether its process has ``support.gated_import``."""

    def __init__(self, label: str) -> None:
        self.label = label

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        return {**item, f"{self.label}_gated": GATED in sys.modules}


class HeavyStage(PlainStage):
    preload_modules = (GATED,)
