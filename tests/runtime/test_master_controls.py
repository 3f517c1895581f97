"""Every master control decodes its payload at the boundary: a malformed one is a bad request.

A real Master over the in-memory transport is sent, for each control, a payload that is not a
map, one that lacks a required field and one that mistypes a field. Each is answered with
``bad_request`` (BadRequest on the client) naming the control and the field, and the value
sent when there is one, never a ``remote_error`` wrapping a KeyError or TypeError.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import BadRequest, RemoteError
from troupe.runtime.tasks.master import operations
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"

WORKER = {"worker_id": "n1/w0", "task_id": "t-000000", "lease_id": 1}

# control -> [(payload, field the error must name, value it must show or None)]
MALFORMED: dict[str, list[tuple[Any, str, str | None]]] = {
    "register_worker": [
        ({"node": "n1", "endpoint": "mem://w"}, "worker_id", None),
        ({"worker_id": "w", "node": "n1"}, "endpoint", None),
        ({"worker_id": "w", "node": "n1", "endpoint": "mem://w", "slots": "2"}, "slots", "'2'"),
        ({"worker_id": "w", "node": "n1", "endpoint": "mem://w", "gpu": 1.5}, "gpu", "1.5"),
        ({"worker_id": "w", "node": "n1", "endpoint": "mem://w", "kinds": [1]}, "kinds", "1"),
    ],
    "request_task": [
        ({"worker_id": "n1/w0"}, "free_slots", None),
        ({"worker_id": "n1/w0", "free_slots": True}, "free_slots", "True"),
        ({"worker_id": "n1/w0", "free_slots": 1, "wait_s": "long"}, "wait_s", "'long'"),
    ],
    "renew": [
        ({"worker_id": "n1/w0", "task_id": "t"}, "lease_id", None),
        ({**WORKER, "lease_id": "1"}, "lease_id", "'1'"),
        ({**WORKER, "task_id": 7}, "task_id", "7"),
    ],
    "complete": [
        ({"worker_id": "n1/w0", "lease_id": 1}, "task_id", None),
        ({**WORKER, "request": "1"}, "request", "'1'"),
    ],
    "fail": [
        ({"task_id": "t", "lease_id": 1}, "worker_id", None),
        ({**WORKER, "error": ["boom"]}, "error", "['boom']"),
    ],
    "decline": [
        ({"worker_id": "n1/w0", "task_id": "t"}, "lease_id", None),
        ({**WORKER, "kind": 3}, "kind", "3"),
    ],
    "node_beat": [
        ({"endpoint": "mem://n1"}, "node", None),
        ({"node": "n1", "resources": [1, 2]}, "resources", "[1, 2]"),
        # printed in `ctl status` as it is: a newline and terminal escapes came through
        ({"node": "evil\n\x1b[31mRED"}, "node", "'evil\\n\\x1b[31mRED'"),
        ({"node": "x" * 1000}, "node", "..."),
        ({"node": "n1", "resources": {"cpus": -1}}, "resources", "-1"),
        ({"node": "n1", "resources": {"load1": float("nan")}}, "resources", "nan"),
        ({"node": "n1", "resources": {"mem_available_mib": float("inf")}}, "resources", "inf"),
        ({"node": "n1", "resources": {"gpus": True}}, "resources", "True"),
    ],
    "worker_left": [
        ({"pid": 3}, "worker_id", None),
        ({"worker_id": "n1/w0", "pid": "3"}, "pid", "'3'"),
    ],
    "node_dead": [({}, "node", None), ({"node": 1}, "node", "1")],
    "submit": [
        ({"source": "x"}, "job", None),
        ({"job": "job.toml"}, "job", "'job.toml'"),
        ({"job": {}, "job_id": 12}, "job_id", "12"),
    ],
    "cancel": [({}, "job_id", None), ({"job_id": 4}, "job_id", "4")],
    "drain": [({}, "node", None), ({"node": None, "x": 1}, "node", None)],
    "undrain": [({}, "node", None), ({"node": ["n1"]}, "node", "['n1']")],
    "dead": [({}, "job_id", None), ({"job_id": 1.0}, "job_id", "1.0")],
    "done_tasks": [
        ({"task_ids": []}, "job_id", None),
        ({"job_id": "j", "task_ids": ["a", 2]}, "task_ids", "2"),
    ],
    "wait_job": [
        ({"timeout_s": 1}, "job_id", None),
        ({"job_id": "j", "timeout_s": "soon"}, "timeout_s", "'soon'"),
        ({"job_id": "j", "timeout_s": float("nan")}, "timeout_s", "nan"),
        ({"job_id": "j", "timeout_s": -1}, "timeout_s", "-1"),
        ({"job_id": "j", "timeout_s": 1e308}, "timeout_s", "1e+308"),
    ],
    "owner_beat": [({}, "owner", None), ({"owner": 5}, "owner", "5")],
    "owner_seen": [({"x": 1}, "owner", None), ({"owner": ["m"]}, "owner", "['m']")],
}


@asynccontextmanager
async def master(tmp_path: Path) -> AsyncIterator[Runtime]:
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    m = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(m.run)
            await m.ready.wait()
            async with Runtime("client", "client", hub.transport()) as client:
                yield client
            m.stop()
    finally:
        journal.close()


async def test_every_master_control_answers_a_malformed_payload_with_bad_request(tmp_path: Path) -> None:
    """Missing and mistyped fields, and payloads that are not maps, are bad requests by name."""
    async with master(tmp_path) as client:
        for control, cases in MALFORMED.items():
            with pytest.raises(BadRequest, match=f"control '{control}'.*payload must be a map"):
                await client.control(MASTER, control, ["not", "a", "map"])
            for payload, field, value in cases:
                with pytest.raises(BadRequest) as caught:
                    await client.control(MASTER, control, payload)
                text = str(caught.value)
                assert f"control {control!r}" in text and repr(field) in text, (control, payload, text)
                assert value is None or value in text, (control, payload, text)
                assert not isinstance(caught.value, RemoteError)


async def test_well_formed_payloads_still_work_after_the_bad_ones(tmp_path: Path) -> None:
    """A bad request changes nothing: the master goes on answering good ones as before."""
    async with master(tmp_path) as client:
        with pytest.raises(BadRequest):
            await client.control(MASTER, "register_worker", {"worker_id": "w"})
        reply = await client.control(
            MASTER,
            "register_worker",
            {
                "worker_id": "n1/w0",
                "node": "n1",
                "endpoint": "mem://nowhere",
                "pid": None,
                "slots": 2,
                "cpu": 2,
                "gpu": 0,
                "kinds": ["k"],
            },
        )
        assert reply["ok"] is True
        sub = await client.control(
            MASTER, "submit", {"job": {"job": {"name": "j", "kind": "k", "count": 1}}, "source": "t"}
        )
        assert sub == {"job_id": "j", "tasks": 1, "already": False, "state": None}
        got = await client.control(MASTER, "request_task", {"worker_id": "n1/w0", "free_slots": 1})
        (lease,) = got["leases"]
        done = await client.control(
            MASTER,
            "complete",
            {
                "worker_id": "n1/w0",
                "task_id": lease["task_id"],
                "lease_id": lease["lease_id"],
                "result_ref": None,
            },
        )
        assert done["outcome"] == "committed"
        view = await client.control(MASTER, "wait_job", {"job_id": "j", "timeout_s": 5})
        assert view["state"] == "done"


async def test_waits_for_a_job_past_the_bound_are_answered_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that sends many long ``wait_job`` and leaves cannot hold the master's memory: past
    ``MAX_JOB_WAITERS`` waiting at once, a wait is answered at once with the running job."""
    monkeypatch.setattr(operations, "MAX_JOB_WAITERS", 2)
    async with master(tmp_path) as client:
        await client.control(
            MASTER, "submit", {"job": {"job": {"name": "j", "kind": "k", "count": 1}}, "source": "t"}
        )
        with anyio.fail_after(30):  # a bound on a hang: the waits below last 600 s unanswered
            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    tg.start_soon(client.control, MASTER, "wait_job", {"job_id": "j", "timeout_s": 600})
                await anyio.wait_all_tasks_blocked()
                view = await client.control(MASTER, "wait_job", {"job_id": "j", "timeout_s": 600})
                assert view["state"] == "running"
                tg.cancel_scope.cancel()
