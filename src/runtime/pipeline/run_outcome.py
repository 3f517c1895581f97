"""What a pipeline run returns beyond the engine's result: the answer to a run that finished
already (read from ``out``'s record), the items of the master's job by how they ended (every
run's), and the run's wall time split into start-up, steady state and finalisation.

Apart from ``runner`` because each turns records the run holds into a :class:`PipelineResult`
(or its figures), with nothing started or awaited.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from troupe.runtime.errors import TroupeError
from troupe.runtime.tasks.book import TaskBook

from .result import PipelineMetrics, PipelineResult
from .run_dir import RunDir

__all__ = ["already_complete", "completed_run", "job_items", "with_split"]


def completed_run(out: str | os.PathLike[str]) -> PipelineResult | None:
    """What a rerun into ``out`` would answer at once (``already_complete``) when a run finished
    there, its outputs still as it wrote them; None otherwise (nothing finished there, or its
    record cannot be read). A run stopped by a signal after its finalize hooks returned is such
    a run: its record is written then, before its processes stop. On a cluster, a rerun also
    asks the master whether its job is the one recorded (``RunDir.completed_job``); this reads
    the record alone, as the run that just wrote it does."""
    try:
        complete = RunDir(Path(out).resolve()).completed()
    except (TroupeError, OSError):
        return None
    return None if complete is None else already_complete(complete)


def already_complete(complete: dict[str, Any]) -> PipelineResult:
    finals = complete.get("finals")
    items = complete.get("items")
    items = items if isinstance(items, dict) else {}  # a record written before runs kept them
    metrics = PipelineMetrics((), 0.0, 0, 0, 0, 0, 0.0, 0.0, 0.0, "")
    return PipelineResult(
        metrics,
        {},
        {},
        finals=dict(finals) if isinstance(finals, dict) else {},
        already_complete=True,
        made_nothing=complete.get("made_nothing") is True,
        ended={k: v for k, v in items.items() if isinstance(v, int) and v >= 0},
    )


def job_items(book: TaskBook, job_id: str) -> dict[str, int]:
    """The job's items by how they ended, every run's (the master's book): ``ok``, ``pruned``
    (done, their result ref says which; those compacted away count as ok) and ``dead``."""
    ends = book.result_counts(job_id)
    return {
        "ok": ends.get("ok", 0) + ends.get("compacted", 0),
        "pruned": ends.get("pruned", 0),
        "dead": ends.get("dead", 0),
    }


def with_split(
    result: PipelineResult, start: float, engine_created: float, last_done: float | None, end: float
) -> PipelineResult:
    """``result`` with its wall time split into start-up, steady state and finalisation.

    Start-up ends when the last stage's first replica served (the scale log's first
    ``started`` of each stage); finalisation begins at the last item's outcome.
    """
    first: dict[str, float] = {}
    for at, stage, _replicas, what in result.scale_log:
        if what == "started":
            first.setdefault(stage, at)
    serving = min(engine_created + max(first.values(), default=0.0), end)
    finishing = min(max(last_done if last_done is not None else serving, serving), end)
    return replace(
        result,
        wall_s=end - start,
        startup_s=serving - start,
        steady_s=finishing - serving,
        finalize_s=end - finishing,
    )
