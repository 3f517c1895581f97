"""run_pipeline_sync misused from Python says what to do in one line: called where an event loop
already runs (it was anyio's "Already running asyncio in this thread"), or given bad items."""

from __future__ import annotations

import asyncio

import pytest

from troupe.runtime import ConfigError, PipelineConfig, StageConfig, run_pipeline_sync


def test_run_pipeline_sync_inside_a_running_loop_names_the_async_form() -> None:
    async def inside() -> None:
        run_pipeline_sync("no-such-pipeline.toml")

    with pytest.raises(RuntimeError, match=r"an event loop already runs .*await run_pipeline\(\.\.\.\)"):
        asyncio.run(inside())


@pytest.mark.parametrize(
    ("items", "said"), [(0, "must be >= 1 (got 0)"), ("3", "must be an integer (got '3')")]
)
def test_items_given_wrong_from_python_is_one_line(items: object, said: str) -> None:
    """As a file's: pydantic's own message ran to four lines and a URL."""
    cfg = PipelineConfig(name="p", items=2, stages=(StageConfig(name="a", actor="m:S"),))
    with pytest.raises(ConfigError) as refused:
        run_pipeline_sync(cfg, items=items)  # type: ignore[arg-type]
    assert str(refused.value) == f"run_pipeline(items=...): items: {said}"
