"""A store stage whose process dies right after it commits one item's output, before it answers
(as a replica killed by the OOM killer, or lost with its node, at that moment): the e2e check of
an item found committed after its store failed it (report jx 4).

Its outputs are files ``{folder}/{task_id}`` written whole (a rename), and ``committed_among``
names those there. It kills its own process (SIGKILL) after committing the item named
``dies``, once: a file beside the outputs says it did.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from troupe.runtime.pipeline.stage import StageActor

__all__ = ["CommitThenDieStage"]


class CommitThenDieStage(StageActor):
    """Commits each item's output, and dies once right after committing ``dies``'s."""

    def __init__(self, folder: str, dies: str) -> None:
        self.folder = Path(folder)
        self.dies = dies

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        task_id = str(item["task_id"])
        staged = self.folder / f".{task_id}.staged"
        staged.write_text(str(item["seed"]), encoding="utf-8")
        staged.rename(self.folder / task_id)  # the commit
        died = self.folder / ".died"
        if task_id == self.dies and not died.exists():
            died.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return {"task_id": task_id}

    def committed_among(self, task_ids: list[str]) -> list[str]:
        return [t for t in task_ids if (self.folder / t).is_file()]
