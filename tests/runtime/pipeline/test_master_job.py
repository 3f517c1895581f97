"""A pipeline's job on a master: a rerun goes on with the job the master has; a run that asks
for other items than the job was made with is refused, before anything moves."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.memory_master import MASTER, master_in_memory
from troupe.actors.datagen.config import default_pipeline
from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline.master_job import master_source

pytestmark = pytest.mark.anyio


async def test_a_rerun_goes_on_with_the_same_job(tmp_path: Path) -> None:
    cfg = default_pipeline(items=8)
    async with master_in_memory(tmp_path) as m:
        _, before = await master_source(m.client, MASTER, cfg)
        assert before == 0
        _, again = await master_source(m.client, MASTER, cfg)  # the master has it: kept
        jobs = await m.call("jobs")
        assert [(j["job_id"], j["total"]) for j in jobs] == [(cfg.name, 8)]
        assert again == 0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"items": 12}, "items=12"),
        ({"seed_start": 100}, "seed_start=100"),
        ({"max_attempts": 5}, "max_attempts=5"),
    ],
)
async def test_other_items_under_the_same_name_are_refused(
    tmp_path: Path, change: dict[str, int], named: str
) -> None:
    cfg = default_pipeline(items=8)
    async with master_in_memory(tmp_path) as m:
        await master_source(m.client, MASTER, cfg)
        with pytest.raises(ConfigError) as refused:
            await master_source(m.client, MASTER, cfg.model_copy(update=change))
        message = str(refused.value)
        assert f"the master's job {cfg.name!r} was made with other items (8 tasks" in message
        assert named in message and "another [pipeline] name" in message
        jobs = await m.call("jobs")
        assert [(j["job_id"], j["total"]) for j in jobs] == [(cfg.name, 8)]  # left as it was
