"""``render_plan`` renders a long episode in batched calls of frames, reporting each batch
(a replica's progress), with the same pixels as one call over every frame."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from troupe.actors.datagen import render as render_module
from troupe.actors.datagen.lifecycle import NavPlanner, SceneLoader
from troupe.actors.datagen.render import render_plan
from troupe.actors.datagen.scene_wire import plan_from_wire, scene_from_wire


def test_batches_of_frames_equal_one_call_and_report_every_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    item = NavPlanner(max_frames=12).process(
        SceneLoader(width=16, height=12).process({"task_id": "t", "seed": 3})
    )
    scene, plan = scene_from_wire(item["scene"]), plan_from_wire(item["plan"])
    whole_rgb, whole_depth = render_plan(scene, plan, "cpu")
    reported: list[int] = []
    monkeypatch.setattr(render_module, "PIXELS_PER_CALL", 16 * 12 * 5)  # 5 frames a call
    rgb, depth = render_plan(scene, plan, "cpu", on_frames=reported.append)
    n = len(plan.positions)
    assert reported == [5] * (n // 5) + ([n % 5] if n % 5 else [])
    assert sum(reported) == len(plan.positions) == len(rgb)
    np.testing.assert_array_equal(rgb, whole_rgb)
    np.testing.assert_array_equal(depth, whole_depth)


class _Runtime:
    def __init__(self) -> None:
        self.reports: list[tuple[int, str | None]] = []

    def progress(self, n: int = 1, note: str | None = None) -> None:
        self.reports.append((n, note))


def test_a_replica_reports_its_frames_as_progress() -> None:
    """Under a runtime, each batch of frames counts as progress: a long episode is no hang."""
    from troupe.actors.datagen.lifecycle import RaycastRenderer

    item = NavPlanner(max_frames=10).process(
        SceneLoader(width=8, height=6).process({"task_id": "t", "seed": 3})
    )
    renderer = RaycastRenderer(device="cpu")
    runtime = _Runtime()
    renderer.runtime = runtime  # type: ignore[assignment]
    out = renderer.process(item)
    assert sum(n for n, _ in runtime.reports) == len(out["rgb"]) > 0
