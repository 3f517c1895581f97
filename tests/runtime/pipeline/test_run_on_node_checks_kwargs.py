"""``run_pipeline(..., node=)`` (what a test's ``cluster.run_pipeline`` calls) checks the stage
classes installed here, their kwargs included, before it reaches the node: a stage given no
required kwarg was refused by ``troupe run`` at once but, on a running node, failed each
replica as it started, with a TypeError placed in troupe's own runtime.py."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from troupe.runtime import ConfigError, PipelineConfig, StageConfig
from troupe.runtime.pipeline.runner import run_pipeline

NOWHERE = "tcp://127.0.0.1:26510"  # no node listens: the check must refuse before any call


async def test_a_missing_stage_kwarg_is_refused_before_the_node_is_reached(tmp_path: Path) -> None:
    store = StageConfig(name="store", actor="troupe.actors.bench.cpu_work:CpuStore")  # no directory
    cfg = PipelineConfig(name="p", items=2, stages=(store,))
    with anyio.fail_after(60), pytest.raises(ConfigError) as refused:
        await run_pipeline(cfg, tmp_path / "out", node=NOWHERE)
    said = str(refused.value)
    assert (
        "stages.store.kwargs: troupe.actors.bench.cpu_work:CpuStore: needs 'directory' in kwargs" in said
    ), said
