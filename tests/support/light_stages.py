"""Two actors for the light template's tests: ``Plain`` preloads nothing; ``Heavy`` preloads
``support.gated_import``, whose import waits for a gate (a stand-in for torch). Each says
whether its process has that module."""

from __future__ import annotations

import os
import sys
from typing import Any

from troupe.runtime import Actor, handles

__all__ = ["Heavy", "Plain"]

GATED = "support.gated_import"


class Plain(Actor):
    @handles("where")
    def where(self, _: Any) -> dict[str, Any]:
        return {"gated": GATED in sys.modules, "ppid": os.getppid()}


class Heavy(Plain):
    preload_modules = (GATED,)
