"""``run_pipeline_sync`` where an event loop already runs (an async function, Jupyter) says to
await ``run_pipeline`` there: it was anyio's "Already running asyncio in this thread"."""

from __future__ import annotations

import asyncio

import pytest

from troupe.runtime import run_pipeline_sync


def test_run_pipeline_sync_inside_a_running_loop_names_the_async_form() -> None:
    async def inside() -> None:
        run_pipeline_sync("no-such-pipeline.toml")

    with pytest.raises(RuntimeError, match=r"an event loop already runs .*await run_pipeline\(\.\.\.\)"):
        asyncio.run(inside())
