"""The last item's report, and the job's end, go to the master as the item settles: not after
the request for more tasks that the master holds meanwhile (up to the source's ``poll_s``
while no task waits), which every run's end waited for."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from support.master_source_run import JobMaster
from troupe.runtime.pipeline.source import MasterSource

pytestmark = pytest.mark.anyio

BOUND_S = 20  # against a hang only: the held request below would hold it for an hour


async def test_the_last_report_and_the_end_do_not_wait_for_a_held_request() -> None:
    master = JobMaster(tasks=2, ttl=3600.0)
    source = MasterSource(master, "tcp://m:1", "job", slots=4, poll_s=3600.0)  # type: ignore[arg-type]
    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, lambda: None)
            items: list[Any] = []
            while len(items) < 2:
                await anyio.sleep(0.01)  # a bounded poll: the whole of it is under fail_after
                items += source.take(2)
            await master.held.wait()  # the loop's next request is held: the old end waited on it
            for item in items:
                source.settle(item.task_id, "ok")
            while not source.exhausted():
                await anyio.sleep(0.01)  # a bounded poll: the whole of it is under fail_after
            tg.cancel_scope.cancel()
    assert sorted(master.completed) == ["t0", "t1"]
