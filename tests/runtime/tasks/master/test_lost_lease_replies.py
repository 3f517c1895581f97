"""A lease whose reply never reached the worker goes back at once, not at its expiry.

A worker's request names the leases it holds (``held``). When the reply to a request is lost
(say, its host's link was cut while the master held the request), the worker asks again without
the lease it never saw: the master puts that task back, no attempt counted, and leases it anew.
Leases the worker did see, ran and reported are never put back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"
WORKER = {"worker_id": "n1/w1", "node": "n1", "endpoint": "mem://nowhere", "slots": 1, "kinds": ["k"]}


@asynccontextmanager
async def master(tmp_path: Path, count: int) -> AsyncIterator[Runtime]:
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    m = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(m.run)
            await m.ready.wait()
            async with Runtime("client", "client", hub.transport()) as client:
                await client.control(MASTER, "register_worker", WORKER)
                job = {"job": {"name": "j", "kind": "k", "count": count, "lease_s": 600}}
                await client.control(MASTER, "submit", {"job": job, "source": "t"})
                yield client
            m.stop()
    finally:
        journal.close()


async def _request(client: Runtime, held: list[int] | None) -> list[dict[str, Any]]:
    payload: dict[str, Any] = {"worker_id": "n1/w1", "free_slots": 1}
    if held is not None:
        payload["held"] = held
    leases: list[dict[str, Any]] = (await client.control(MASTER, "request_task", payload))["leases"]
    return leases


async def test_a_lease_the_worker_never_received_is_leased_again_at_its_next_request(tmp_path: Path) -> None:
    async with master(tmp_path, 1) as client:
        (lost,) = await _request(client, [])  # its reply is lost on the way
        (again,) = await _request(client, [])  # the worker never saw it: it asks empty-handed
        assert again["task_id"] == lost["task_id"] and again["lease_id"] != lost["lease_id"]
        assert again["attempt"] == lost["attempt"] == 1  # no attempt counted
        status = await client.control(MASTER, "status")
        assert status["stale_reports"] == {"lease_unseen": 1}
        assert status["leases_outstanding"] == 1
        # A late report under the lost lease (its copy ran after all) cannot finish it twice.
        done = await client.control(
            MASTER,
            "complete",
            {"worker_id": "n1/w1", "task_id": again["task_id"], "lease_id": again["lease_id"]},
        )
        assert done["outcome"] == "committed"
        view = await client.control(MASTER, "wait_job", {"job_id": "j", "timeout_s": 5})
        assert view["state"] == "done" and view["counts"]["done"] == 1


async def test_leases_the_worker_holds_or_ran_are_never_put_back(tmp_path: Path) -> None:
    async with master(tmp_path, 3) as client:
        (first,) = await _request(client, [])
        assert await _request(client, [first["lease_id"]]) == []  # held: its slot is taken
        await client.control(
            MASTER,
            "complete",
            {"worker_id": "n1/w1", "task_id": first["task_id"], "lease_id": first["lease_id"]},
        )
        (second,) = await _request(client, [first["lease_id"]])  # ran and reported since: named
        await client.control(
            MASTER,
            "complete",
            {"worker_id": "n1/w1", "task_id": second["task_id"], "lease_id": second["lease_id"]},
        )
        # A worker that does not say what it holds (an older getter) is left as it was.
        (third,) = await _request(client, None)
        assert await _request(client, None) == []
        status = await client.control(MASTER, "status")
        assert status["stale_reports"] == {} and status["leases_outstanding"] == 1
        assert third["task_id"] not in {first["task_id"], second["task_id"]}
