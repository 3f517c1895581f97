"""A master that stops answering mid-run is said once, and its return once: the run waits for
it (a cluster's master restarts on its journal) and must not look hung meanwhile."""

from __future__ import annotations

from typing import Any

import pytest

from support.master_source_run import JobMaster, take_and_settle
from troupe.runtime.errors import AskTimeout, PeerLost
from troupe.runtime.pipeline.source import MasterSource

pytestmark = pytest.mark.anyio


class _SilentThenBack(JobMaster):
    """A master with one job of two tasks, after ``silent`` calls that time out (whatever they
    ask: a master that is down answers nothing)."""

    def __init__(self, silent: int, error: type[AskTimeout] = AskTimeout) -> None:
        super().__init__(tasks=2)
        self.silent = silent
        self.error = error

    async def control(self, master: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        if self.silent:
            self.silent -= 1
            raise self.error(f"no reply to {msg_type!r} from {master} within {timeout}s")
        return await super().control(master, msg_type, payload, timeout=timeout)


async def test_a_silent_master_is_said_once_and_its_return_once() -> None:
    master = _SilentThenBack(silent=3)
    source = MasterSource(master, "tcp://m:1", "job", slots=2, poll_s=0.05)  # type: ignore[arg-type]
    told: list[str] = []
    source.on_event = told.append
    await take_and_settle(source, 2)
    assert len(told) == 2, told
    assert told[0].startswith("the master at tcp://m:1 does not answer (AskTimeout)")
    assert "the same command resumes" in told[0]
    assert told[1].startswith("the master at tcp://m:1 answers again after")
    assert sorted(master.completed) == ["t0", "t1"]


async def test_the_runs_own_master_gone_is_not_said_to_come_back() -> None:
    """A one-host run's master lives in the run's process: its connection ended means it
    stopped (a full disk failed its journal), and its error ends the run; "the run waits for it
    and goes on once it is back" was said first, and was not so. A master that outlives the
    run (a cluster's) is still said to be waited for."""
    for outlives, expected in ((False, 0), (True, 2)):
        master = _SilentThenBack(silent=3, error=PeerLost)
        source = MasterSource(  # type: ignore[arg-type]
            master, "tcp://m:1", "job", slots=2, poll_s=0.05, master_outlives_run=outlives
        )
        told: list[str] = []
        source.on_event = told.append
        await take_and_settle(source, 2)
        assert len(told) == expected, told
