"""A master process collects with the master's thresholds and shows its pauses in its status."""

from __future__ import annotations

import pytest

from support.chaos import TaskMaster
from troupe.runtime.gc_pauses import MASTER_GC_THRESHOLDS

pytestmark = pytest.mark.e2e


async def test_troupe_master_start_collects_with_the_master_s_thresholds_and_counts_its_pauses(
    master: TaskMaster,
) -> None:
    before = (await master.call("status"))["gc"]
    assert before["thresholds"] == list(MASTER_GC_THRESHOLDS)
    # 30,000 tasks are some hundred thousand objects the master keeps: its collector runs.
    job = {"job": {"name": "many", "kind": "sleep", "count": 30_000}}
    await master.call("submit", {"job": job, "source": "many.toml"}, timeout=120.0)
    after = (await master.call("status", timeout=60.0))["gc"]
    assert sum(after["collections"]) > sum(before["collections"]), (before, after)
    assert after["pause_s"] > before["pause_s"]
    assert after["pause_s"] >= after["longest_pause_s"] > 0
