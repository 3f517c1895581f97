"""A pipeline run's first renewal of a lease comes a renewal period (a third of its TTL) after
the lease came: the renew loop had timed its first renewal from before any lease came, at the
default period (20 s), so a lease shorter than that ended at the master before it was renewed
(its task taken back and run again, an attempt lost)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from support.memory_master import MASTER, master_in_memory
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.pipeline.source import MasterSource

pytestmark = pytest.mark.anyio

BOUND_S = 60.0  # a bound on a hang: the old loop renewed after 20 s, a failure, not a hang
LEASE_S = 15.0  # under the old 20 s period; renewed 5 s after it came, 10 s to spare on a loaded machine


class _Renewals:
    """The run's runtime, keeping the master's answer to each ``renew``."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.answers: list[Any] = []
        self.answered = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def control(
        self, endpoint: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0
    ) -> Any:
        reply = await self._runtime.control(endpoint, msg_type, payload, timeout=timeout)
        if msg_type == "renew":
            self.answers.append(reply)
            self.answered.set()
        return reply


async def test_a_lease_shorter_than_the_default_period_is_renewed_before_it_ends(tmp_path: Path) -> None:
    async with master_in_memory(tmp_path) as m:
        job = {"name": "j", "kind": "j", "count": 1, "lease_s": LEASE_S}
        await m.call("submit", {"job": {"job": job}, "source": "t"})
        async with Runtime("n1", "run", m.hub.transport()) as rt:
            runtime = _Renewals(rt)
            source = MasterSource(runtime, MASTER, "j", slots=1, poll_s=0.05)  # type: ignore[arg-type]
            with anyio.fail_after(BOUND_S):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(source.run, lambda: None)
                    items: list[Any] = []
                    while not items:
                        await anyio.sleep(0.01)  # a bounded poll: the whole of it is under fail_after
                        items = source.take(1)
                    await runtime.answered.wait()  # the item is held (not settled) until then
                    source.settle(items[0].task_id, "ok")
        assert runtime.answers[0].get("outcome") == "renewed", runtime.answers[0]
        assert items[0].attempt == 1
        jobs = await m.call("jobs")
        assert [(j["state"], j["counts"].get("done")) for j in jobs if j["job_id"] == "j"] == [("done", 1)], (
            jobs
        )
