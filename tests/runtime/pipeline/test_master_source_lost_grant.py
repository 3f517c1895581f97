"""A request whose reply the run never got (the master paused past the call's timeout, then
answered the requests queued meanwhile): its leases go back at the run's next request, where
the run's slots stayed taken at the master until the leases expired (two minutes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from support.master_source_run import take_and_settle
from support.memory_master import MASTER, master_in_memory
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import AskTimeout
from troupe.runtime.pipeline.source import MasterSource

pytestmark = pytest.mark.anyio


class _FirstGrantLost:
    """The run's runtime, whose first ``request_task`` reaches the master (which grants) while
    its reply is lost."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.lost: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def control(
        self, endpoint: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0
    ) -> Any:
        reply = await self._runtime.control(endpoint, msg_type, payload, timeout=timeout)
        if msg_type == "request_task" and not self.lost and reply.get("leases"):
            self.lost.append(reply)
            raise AskTimeout(f"no reply to {msg_type!r} from {endpoint} within {timeout}s")
        return reply


async def test_a_grant_whose_reply_was_lost_goes_back_at_the_next_request(tmp_path: Path) -> None:
    async with master_in_memory(tmp_path) as m:
        job = {"name": "j", "kind": "j", "count": 2, "lease_s": 600}
        await m.call("submit", {"job": {"job": job}, "source": "t"})
        async with Runtime("n1", "run", m.hub.transport()) as rt:
            runtime = _FirstGrantLost(rt)
            source = MasterSource(runtime, MASTER, "j", slots=2, poll_s=0.05)  # type: ignore[arg-type]
            with anyio.fail_after(30):  # a bound on a hang: without the return, ten minutes
                await take_and_settle(source, 2, timeout=30)
        assert runtime.lost, "no grant was lost: the test tested nothing"
        status = await m.call("status")
        assert status["stale_reports"].get("lease_unseen", 0) >= 1, status["stale_reports"]
        jobs = await m.call("jobs")
        assert [j["state"] for j in jobs if j["job_id"] == "j"] == ["done"], jobs
