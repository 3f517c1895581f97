"""The last item's report, and the job's end, go to the master as the item settles: not after
the request for more tasks that the master holds meanwhile (up to the source's ``poll_s``
while no task waits), which every run's end waited for."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from support.master_source_run import RuntimeControls
from troupe.runtime.pipeline.source import MasterSource

pytestmark = pytest.mark.anyio

BOUND_S = 20  # against a hang only: the held request below would hold it for an hour


class _HoldsItsPolls(RuntimeControls):
    """A master with one job of two tasks that holds a request for more as long as it is asked
    to (``wait_s``) once none is left, as a master with no task to lease does."""

    node = "n"
    address = "tcp://127.0.0.1:1"

    def __init__(self) -> None:
        super().__init__()
        self.todo = [
            {"task_id": f"t{i}", "lease_id": i + 1, "seed": i, "attempt": 1, "ttl": 3600.0} for i in range(2)
        ]
        self.completed: list[str] = []
        self.held = anyio.Event()  # a request is being held now

    async def control(self, master: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        if msg_type == "request_task":
            if self.todo:
                granted, self.todo = self.todo, []
                return {"leases": granted}
            self.held.set()
            await anyio.sleep(payload["wait_s"])
            return {"leases": []}
        if msg_type == "complete":
            self.completed.append(payload["task_id"])
            return {"outcome": "completed"}
        if msg_type == "wait_job":
            return {"state": "done" if len(self.completed) == 2 else "running"}
        if msg_type == "dead":
            return []
        return {}


async def test_the_last_report_and_the_end_do_not_wait_for_a_held_request() -> None:
    master = _HoldsItsPolls()
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
