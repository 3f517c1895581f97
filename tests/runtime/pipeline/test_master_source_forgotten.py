"""A restarted master keeps the leases it held over for a run whose slots are full, and says in
the answers to its renewals and reports that it does not know the run (``known: false``): the
run registers again at once, as a worker's getter does, and only once for all the answers that
say so. Before, it ignored them: a run that asked for no work stayed unknown to the master
(``ctl status``, drains) until its next request."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from support.master_source_run import JobMaster, take_and_settle
from troupe.runtime.pipeline import source as source_module
from troupe.runtime.pipeline.source import MasterSource

pytestmark = pytest.mark.anyio


class _Restarted(JobMaster):
    """A master that restarted after the run registered: it knows the run again only once the
    run registers again. Whether it knows the sender is judged as a call arrives, and answered
    after the other calls on their way arrived too (a batch)."""

    def __init__(self, tasks: int, ttl: float = 60.0) -> None:
        super().__init__(tasks, ttl)
        self.registrations = 0
        self.again = anyio.Event()

    async def control(self, master: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        if msg_type == "register_worker":
            self.registrations += 1
            if self.registrations > 1:
                self.again.set()
            return {"ok": True}
        known = self.registrations > 1
        await anyio.lowlevel.checkpoint()
        if msg_type == "renew":
            return {"outcome": "renewed", "ttl": 0.3, "known": known}
        reply = await super().control(master, msg_type, payload, timeout=timeout)
        return {**reply, "known": known} if msg_type == "complete" else reply


async def test_a_renewal_answered_known_false_registers_the_run_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(source_module, "_TTL_S", 0.3)  # its first renewal half a second in, not 20 s
    master = _Restarted(tasks=1, ttl=0.3)
    source = MasterSource(master, "tcp://m:1", "job", slots=1, poll_s=0.05)  # type: ignore[arg-type]
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, lambda: None)
            items: list[Any] = []
            while not items:
                await anyio.sleep(0.01)  # a bounded poll: the whole of it is under fail_after
                items += source.take(1)
            await master.again.wait()  # held, its slot full: only the renewal tells it
            source.settle(items[0].task_id, "ok")
    assert master.registrations == 2
    assert master.completed == ["t0"]


async def test_reports_answered_known_false_together_register_the_run_again_once() -> None:
    """A second registration would be the run leaving and joining again to the master, its
    leases put back."""
    master = _Restarted(tasks=2)
    source = MasterSource(master, "tcp://m:1", "job", slots=2, poll_s=0.05)  # type: ignore[arg-type]
    await take_and_settle(source, 2)
    assert sorted(master.completed) == ["t0", "t1"]
    assert master.registrations == 2
