"""A one-host run's replicas of stages that preload nothing are forked from the light template,
the heavy stage's from the template (``runtime/node/light_link.py``).

What a user relies on: a CPU stage's replica (with the outbox beside its stage actor) starts
without the modules only another stage needs (torch, for a render stage), and the stage that
needs them has them imported ahead, as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe import run_pipeline_sync
from troupe.runtime.testing.plugin import import_path

PIPELINE = """
[pipeline]
name = "light"
items = 3

[[stages]]
name = "cpu"
actor = "support.light_stages:PlainStage"
kwargs = { label = "cpu" }

[[stages]]
name = "heavy"
actor = "support.light_stages:HeavyStage"
kwargs = { label = "heavy" }
"""


def test_a_cpu_stage_is_forked_without_what_another_stage_preloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the template imports support.* as workers do
    gate = tmp_path / "gate"
    gate.touch()  # open: the stand-in for torch imports at once
    monkeypatch.setenv("TROUPE_TEST_GATE", str(gate))
    toml = tmp_path / "light.toml"
    toml.write_text(PIPELINE, encoding="utf-8")

    result = run_pipeline_sync(toml)

    assert result.counts()["ok"] == 3
    assert [(o["cpu_gated"], o["heavy_gated"]) for o in result.outputs.values()] == [(False, True)] * 3
