"""The run's progress shows every item's outcome before the finalize hooks run: the display is
throttled (a few frames a second), and the items that ended in the last frame's window were shown
only after finalize, so a long finalize showed 180/200 throughout, and a Ctrl-C then said "at
least 160 of 200 items done" of a run whose every item was done."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import anyio

from support.recording_node import NODE, RecordingNode
from troupe.cli.commands.run_pipeline import metrics_table, stopped_line
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.result import PipelineMetrics
from troupe.runtime.pipeline.source import LocalSource

HANG_GUARD_S = 60  # a bound on a hang, never on speed


async def test_the_last_progress_before_the_end_counts_every_item() -> None:
    cfg = PipelineConfig.model_validate(
        {"name": "p", "items": 4, "scale_interval_s": 3600.0, "stages": [{"name": "a", "actor": "m:Stage"}]}
    )
    shown: list[PipelineMetrics] = []
    engine = PipelineEngine(
        cfg,
        RecordingNode(),  # type: ignore[arg-type]
        NODE,
        source=LocalSource(cfg.name, cfg.items),
        on_change=shown.append,
        on_change_every_s=3600.0,  # one frame an hour: only what the engine forces is shown
    )
    with anyio.fail_after(HANG_GUARD_S):
        result = await engine.run()
    assert result.metrics.items_done == 4
    assert shown and shown[-1].items_done == 4, [m.items_done for m in shown]
    # The run's table shows the most each queue held (every queue is empty at the end): "queue"
    # read as its depth, full.
    assert "queue max" in [str(c.header) for c in metrics_table(result.metrics).columns]


def test_a_stop_once_every_item_was_done_says_it_came_while_finalising(tmp_path: Path) -> None:
    metrics = SimpleNamespace(items_done=150)
    said = stopped_line(metrics, 50, 200, tmp_path)  # type: ignore[arg-type]
    assert said.startswith("stopped while finalising: all 200 items were done;"), said
    assert said.endswith("the same command run again finalises")
    fewer = stopped_line(SimpleNamespace(items_done=100), 50, 200, tmp_path)  # type: ignore[arg-type]
    assert fewer.startswith("stopped: at least 150 of 200 items done;"), fewer
    none = stopped_line(SimpleNamespace(items_done=0), 0, 8, tmp_path)  # type: ignore[arg-type]
    assert none.startswith("stopped before any item's end was recorded (8 items); what the stages"), none
