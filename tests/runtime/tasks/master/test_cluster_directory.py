"""The master as the cluster's directory of names, and its count of stale reports.

Nodes list their processes and mailboxes in their beats; the master answers ``resolve`` for
an actor of any live node (so a node resolves another host's actor through it). A report or a
renewal for a lease that ended (its host was cut off and the task requeued, or the task is done
already) is dropped and counted, never applied twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import BadRequest, UnknownActor
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.master.nodes import NodeTable, ProcessEntry
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"


def _table() -> NodeTable:
    table = NodeTable(timeout_s=3.0)
    a = {"w1": ProcessEntry("tcp://10.0.0.1:5001", {"echo": "tcp://10.0.0.1:5002"})}
    b = {
        "w9": ProcessEntry(
            "tcp://10.0.0.2:6001", {"echo": "tcp://10.0.0.2:6002", "sink": "tcp://10.0.0.2:6003"}
        )
    }
    table.beat("a", "tcp://10.0.0.1:7470", {}, 0.0, a)
    table.beat("b", "tcp://10.0.0.2:7470", {}, 0.0, b)
    return table


def test_the_node_table_resolves_every_address_form_on_live_nodes() -> None:
    table = _table()
    assert table.resolve(ActorAddress.parse("sink")) == (
        ActorAddress("b", "w9", "sink"),
        "tcp://10.0.0.2:6003",
    )
    # A bare name held by two nodes: the first by name wins; a full address picks the node.
    assert table.resolve(ActorAddress.parse("echo"))[0] == ActorAddress("a", "w1", "echo")
    assert table.resolve(ActorAddress.parse("b/w9/echo"))[1] == "tcp://10.0.0.2:6002"
    assert table.resolve(ActorAddress.parse("w9/echo"))[0].node == "b"
    assert table.resolve(ActorAddress.parse("b/node")) == (
        ActorAddress("", "b", "node"),
        "tcp://10.0.0.2:7470",
    )
    with pytest.raises(UnknownActor, match="a/w9/echo"):
        table.resolve(ActorAddress.parse("a/w9/echo"))


def test_a_dead_node_resolves_nothing_until_it_beats_again_and_counts_its_return() -> None:
    table = _table()
    assert table.expired(now=3.5) == ["a", "b"]
    with pytest.raises(UnknownActor, match="any live node"):
        table.resolve(ActorAddress.parse("echo"))
    assert table.beat("b", "", {}, 4.0) is True  # back; a beat without processes keeps the last
    assert table.resolve(ActorAddress.parse("echo"))[0] == ActorAddress("b", "w9", "echo")
    (b,) = [n for n in table.nodes() if n.node == "b"]
    assert b.revivals == 1 and b.endpoint == "tcp://10.0.0.2:7470"


@asynccontextmanager
async def master(tmp_path: Path) -> AsyncIterator[tuple[Runtime, Master]]:
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    m = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(m.run)
            await m.ready.wait()
            async with Runtime("client", "client", hub.transport()) as client:
                yield client, m
            m.stop()
    finally:
        journal.close()


BEAT: dict[str, Any] = {
    "node": "n2",
    "endpoint": "tcp://10.213.7.2:7470",
    "resources": {},
    "processes": {
        "w-echo": {"endpoint": "tcp://10.213.7.2:5000", "actors": {"echo": "tcp://10.213.7.2:5001"}}
    },
}


async def test_the_master_answers_resolve_from_its_nodes_beats(tmp_path: Path) -> None:
    async with master(tmp_path) as (client, _):
        with pytest.raises(UnknownActor):
            await client.control(MASTER, "resolve", {"address": "echo"})
        await client.control(MASTER, "node_beat", BEAT)
        reply = await client.control(MASTER, "resolve", {"address": "echo"})
        assert reply == {"address": "n2/w-echo/echo", "endpoint": "tcp://10.213.7.2:5001"}
        status = await client.control(MASTER, "status")
        assert [(n["node"], n["revivals"]) for n in status["nodes"]] == [("n2", 0)]


@pytest.mark.parametrize(
    ("processes", "field"),
    [
        ({"w": "tcp://x:1"}, "processes"),
        ({"w": {"actors": {}}}, "endpoint"),
        ({"w": {"endpoint": "tcp://x:1", "actors": {"a": 5}}}, "actors"),
    ],
)
async def test_a_beat_with_malformed_processes_is_a_bad_request(
    tmp_path: Path, processes: Any, field: str
) -> None:
    async with master(tmp_path) as (client, _):
        with pytest.raises(BadRequest, match=f"control 'node_beat'.*'{field}'"):
            await client.control(MASTER, "node_beat", {**BEAT, "processes": processes})
        with pytest.raises(BadRequest, match=r"control 'resolve'.*'address'"):
            await client.control(MASTER, "resolve", {"address": "a//b"})


async def test_reports_and_renewals_of_an_ended_lease_are_dropped_and_counted(tmp_path: Path) -> None:
    worker = {"worker_id": "n3/w1", "node": "n3", "endpoint": "mem://nowhere", "slots": 1, "kinds": ["k"]}
    async with master(tmp_path) as (client, m):
        await client.control(MASTER, "register_worker", worker)
        await client.control(
            MASTER, "submit", {"job": {"job": {"name": "j", "kind": "k", "count": 1}}, "source": "t"}
        )
        (lease,) = (await client.control(MASTER, "request_task", {"worker_id": "n3/w1", "free_slots": 1}))[
            "leases"
        ]
        # n3 is cut off: the master declares it dead, the task is requeued and done elsewhere.
        await client.control(MASTER, "node_dead", {"node": "n3"})
        await client.control(MASTER, "register_worker", {**worker, "worker_id": "n1/w1", "node": "n1"})
        (again,) = (await client.control(MASTER, "request_task", {"worker_id": "n1/w1", "free_slots": 1}))[
            "leases"
        ]
        assert again["task_id"] == lease["task_id"] and again["lease_id"] != lease["lease_id"]
        ids = {"task_id": again["task_id"]}
        done = await client.control(
            MASTER, "complete", {"worker_id": "n1/w1", **ids, "lease_id": again["lease_id"]}
        )
        assert done["outcome"] == "committed"
        # The link comes back: n3's renewal and its report of the same task arrive late.
        stale = {"worker_id": "n3/w1", **ids, "lease_id": lease["lease_id"]}
        assert (await client.control(MASTER, "renew", stale))["outcome"] == "rejected"
        late = await client.control(MASTER, "complete", stale)
        assert late["outcome"] == "duplicate" and late["known"] is False
        status = await client.control(MASTER, "status")
        assert status["stale_reports"] == {"renew_rejected": 1, "complete_duplicate": 1}
        assert m.stale_reports() == status["stale_reports"]
        view = await client.control(MASTER, "wait_job", {"job_id": "j", "timeout_s": 5})
        assert view["state"] == "done" and view["counts"]["done"] == 1


async def test_a_late_worker_left_of_an_earlier_incarnation_is_dropped_and_counted(tmp_path: Path) -> None:
    worker = {"worker_id": "n3/w1", "node": "n3", "endpoint": "mem://w", "pid": 200, "slots": 1}
    async with master(tmp_path) as (client, _):
        await client.control(MASTER, "register_worker", worker)  # the restarted worker, pid 200
        # The node's report that pid 100 exited was held up by the cut: it names the old one.
        assert await client.control(MASTER, "worker_left", {"worker_id": "n3/w1", "pid": 100}) is False
        status = await client.control(MASTER, "status")
        assert [w["worker_id"] for w in status["workers"]] == ["n3/w1"]
        assert status["stale_reports"] == {"worker_left_stale": 1}
