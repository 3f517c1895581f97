"""mt 4: ``troupe ctl drain N`` gave no way to know the drain was done; an operator who stopped
the node at once had its tasks run again elsewhere. ``--wait`` (``drain_wait.py``) returns once
N holds no task, saying what it holds as that changes; on its bound it fails naming what is
left; Ctrl-C leaves the drain in place and says so. Against a scripted master (a real process
runtime on loopback that answers ``drain`` and ``status``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from support.port_range import test_endpoint
from troupe.cli.drain_wait import drain_and_wait, held_on
from troupe.runtime import TroupeError
from troupe.runtime.core.runtime import process_runtime

pytestmark = pytest.mark.anyio

POLL_S = 0.01
BOUND_S = 60  # against a hang only


def _status(
    leases: dict[str, int],
    *,
    draining: bool = True,
    alive: bool = True,
    left: bool = False,
    processes: int = 2,
    age: float | None = None,
) -> dict[str, Any]:
    workers = [{"worker_id": f"n1/w{i}", "node": "n1", "used": 0} for i in range(2)]
    for w in workers:
        w["used"] = leases.get(w["worker_id"], 0)
    node = {"node": "n1", "alive": alive, "left": left, "draining": draining, "processes": processes}
    if age is not None:  # the master's age of the node's last beat (an older master says none)
        node["last_beat_age_s"] = age
    return {"master": "master", "jobs": [], "nodes": [node], "workers": workers}


@asynccontextmanager
async def _master(statuses: list[dict[str, Any]]) -> AsyncIterator[tuple[str, list[str]]]:
    """A master whose ``status`` answers ``statuses`` in turn (the last again and again)."""
    asked: list[str] = []

    async def drain(payload: Any) -> dict[str, Any]:
        asked.append(f"drain {payload['node']}")
        return {"node": payload["node"], "draining": True}

    async def status(payload: Any) -> dict[str, Any]:
        asked.append("status")
        return statuses.pop(0) if len(statuses) > 1 else statuses[0]

    async with process_runtime("m", "master", bind=test_endpoint()) as rt:
        rt.register_controls({"drain": drain, "status": status})
        yield rt.address, asked


async def test_the_wait_says_what_the_node_holds_and_returns_once_it_holds_nothing() -> None:
    said: list[str] = []
    statuses = [
        _status({"n1/w0": 2, "n1/w1": 1}),
        _status({"n1/w0": 2, "n1/w1": 1}),  # unchanged: not said again
        _status({"n1/w0": 1}),
        _status({}, processes=3),  # its two workers and a replica of a run
    ]
    async with _master(statuses) as (endpoint, asked):
        with anyio.fail_after(BOUND_S):
            done = await drain_and_wait(endpoint, "n1", 5.0, None, said.append, POLL_S)
    assert asked[0] == "drain n1"
    assert said == [
        "node n1 still holds 3 tasks (n1/w0: 2, n1/w1: 1)",
        "node n1 still holds 1 task (n1/w0: 1)",
    ]
    assert done.startswith("node n1 is drained: it holds no task; stop it now"), done
    assert "1 other process runs there (a `troupe run --cluster`'s replicas" in done, done


@pytest.mark.parametrize("replica", [False, True])
async def test_a_drained_node_s_processes_are_said_as_its_next_beat_counts_them(replica: bool) -> None:
    """mv 3: the drain stopped the node's task workers and the master dropped them, while the
    node's last beat still counted their processes: "1 other process runs there" was said of a
    node that ran none. The processes are said as a beat sent after the wait ended counts them."""
    stale = _status({}, processes=3, age=3600.0)  # a beat from before the workers stopped
    fresh = _status({}, processes=3 if replica else 2, age=0.0)
    statuses = [_status({"n1/w0": 1}), stale, stale, fresh]
    async with _master(statuses) as (endpoint, asked):
        with anyio.fail_after(BOUND_S):
            done = await drain_and_wait(endpoint, "n1", 5.0, None, lambda _line: None, POLL_S)
    assert asked.count("status") == 4, asked  # the stale beat was not taken for now's count
    assert done.startswith("node n1 is drained: it holds no task; stop it now"), done
    assert ("1 other process runs there" in done) is replica, done


async def test_the_wait_runs_out_naming_what_the_node_still_holds() -> None:
    async with _master([_status({"n1/w1": 1})]) as (endpoint, _):
        with anyio.fail_after(BOUND_S), pytest.raises(TroupeError) as caught:
            await drain_and_wait(endpoint, "n1", 5.0, 0.2, lambda _: None, POLL_S)
    message = str(caught.value)
    assert message.startswith("node n1 still holds 1 task (n1/w1: 1) after "), message
    assert "it drains on" in message


async def test_an_undrain_during_the_wait_ends_it_saying_so() -> None:
    statuses = [_status({"n1/w1": 1}), _status({"n1/w1": 1}, draining=False)]
    async with _master(statuses) as (endpoint, _):
        with anyio.fail_after(BOUND_S), pytest.raises(TroupeError) as caught:
            await drain_and_wait(endpoint, "n1", 5.0, None, lambda _: None, POLL_S)
    assert str(caught.value).startswith("node n1 does not drain any more (an undrain ended it?)")


async def test_a_node_that_stopped_meanwhile_holds_nothing() -> None:
    statuses = [_status({"n1/w1": 1}), _status({}, alive=False, left=True)]
    async with _master(statuses) as (endpoint, _):
        with anyio.fail_after(BOUND_S):
            done = await drain_and_wait(endpoint, "n1", 5.0, None, lambda _: None, POLL_S)
    assert done == "node n1 is stopped: it holds no task"


async def test_ctrl_c_during_the_wait_leaves_the_drain_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with _master([_status({"n1/w1": 1})]) as (endpoint, asked):
        with anyio.fail_after(BOUND_S), anyio.CancelScope() as scope:  # the command's, as Ctrl-C cancels it
            await drain_and_wait(endpoint, "n1", 5.0, None, lambda _: scope.cancel(), POLL_S)
    assert scope.cancelled_caught
    assert asked.count("drain n1") == 1 and "undrain" not in " ".join(asked)
    err = capsys.readouterr().err
    assert "node n1 stays draining (the wait stopped, not the drain)" in err, err


def test_what_a_status_of_an_older_or_other_shape_says_of_a_node() -> None:
    assert held_on({"nodes": [], "workers": []}, "n1").state == "unlisted"
    dead = held_on(_status({}, alive=False), "n1")
    assert (dead.state, dead.others) == ("dead", 0)
