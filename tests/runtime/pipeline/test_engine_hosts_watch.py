"""The nodes a cluster run keeps placing on (``EngineHosts.watch``) across a restart of the
master: one that restarted knows no node until they beat again, and a run dropped every node
then (their replicas abandoned, running on) and failed when a replica had to start meanwhile
("the cluster offers: no nodes"). A node the master has as dead leaves at once; one it does not
list at all stays for ``unheard_s``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline.hosts import EngineHosts, NoNodeNow
from troupe.runtime.pipeline.replicas import _may_pass
from troupe.runtime.placement import Host

pytestmark = pytest.mark.anyio

BOUND_S = 10  # against a hang only


def _node(name: str, alive: bool = True) -> dict[str, Any]:
    return {"node": name, "endpoint": f"tcp://{name}:1", "alive": alive, "tags": [], "resources": {}}


class _Master:
    """Answers ``status`` with ``nodes``; counts the answers."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.answered = 0

    async def control(self, master: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0) -> Any:
        assert msg_type == "status"
        self.answered += 1
        return {"master": "master", "nodes": list(self.nodes)}


async def _watched(hosts: EngineHosts, master: _Master, nodes: list[dict[str, Any]]) -> frozenset[str]:
    """The live nodes once the watch has read ``nodes`` from the master (twice, to be sure)."""
    master.nodes = nodes
    seen = master.answered
    with anyio.fail_after(BOUND_S):
        while master.answered < seen + 2:
            await anyio.sleep(0.01)  # a bounded poll: the whole of it is under fail_after
    return hosts.alive


async def test_a_restarted_master_that_lists_no_node_yet_loses_none() -> None:
    master = _Master()
    start = [Host("n1", "tcp://n1:1"), Host("n2", "tcp://n2:1")]
    hosts = EngineHosts(start, "tcp://m:1", master, refresh_s=0.01, unheard_s=3600)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(hosts.watch)
        assert await _watched(hosts, master, []) == {"n1", "n2"}  # restarted: nobody beat yet
        assert await _watched(hosts, master, [_node("n1")]) == {"n1", "n2"}  # n2's beat still to come
        assert await _watched(hosts, master, [_node("n1"), _node("n2", alive=False)]) == {"n1"}
        tg.cancel_scope.cancel()


async def test_a_node_the_master_never_lists_again_leaves_after_unheard_s() -> None:
    master = _Master()
    start = [Host("n1", "tcp://n1:1"), Host("n2", "tcp://n2:1")]
    hosts = EngineHosts(start, "tcp://m:1", master, refresh_s=0.01, unheard_s=0)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(hosts.watch)
        assert await _watched(hosts, master, [_node("n1")]) == {"n1"}
        assert await _watched(hosts, master, [_node("n1"), _node("n3")]) == {"n1", "n3"}
        tg.cancel_scope.cancel()


async def test_a_node_that_leaves_the_list_is_said_as_the_master_has_it() -> None:
    """mt 4: a replica's stop given up on a node that stopped said "the master has node n2 as
    dead" (``worker_stop.py``): ``left`` says how the master has it."""
    master = _Master()
    start = [Host(n, f"tcp://{n}:1") for n in ("n1", "n2", "n3")]
    hosts = EngineHosts(start, "tcp://m:1", master, refresh_s=0.01, unheard_s=0)  # type: ignore[arg-type]
    stopped = {**_node("n2", alive=False), "left": True}
    async with anyio.create_task_group() as tg:
        tg.start_soon(hosts.watch)
        assert await _watched(hosts, master, [_node("n1", alive=False), stopped]) == set()
        with anyio.fail_after(BOUND_S):
            said = [await hosts.left(h) for h in start]
        tg.cancel_scope.cancel()
    assert said == ["dead", "stopped", "not listed (not heard from since the master started)"]


def test_a_tag_no_live_node_offers_any_more_is_a_start_that_may_pass() -> None:
    """The only node tagged store died mid-run: its replica's start is tried again (the node
    may be back), saying how to bring it back; it ended the run at once, with no word on how to
    resume. A tag no node offered in this run is refused as before."""
    store = Host("n1", "tcp://n1:1", tags=frozenset({"store"}))
    hosts = EngineHosts([store, Host("n2", "tcp://n2:1", tags=frozenset())])
    assert hosts.pick("store", ["store"]) == store
    hosts.hosts = [h for h in hosts.hosts if h.name != "n1"]  # the master no longer lists it
    with pytest.raises(NoNodeNow, match=r"stages\.store: no node has tags \['store'\].*is gone") as gone:
        hosts.pick("store", ["store"])
    assert _may_pass(gone.value) and "the same command resumes" in str(gone.value)
    with pytest.raises(ConfigError) as never:
        hosts.pick("gpu", ["gpu-box"])
    assert not isinstance(never.value, NoNodeNow) and not _may_pass(never.value)


def test_nodes_that_fit_but_drain_are_said_to_drain_not_to_be_gone() -> None:
    """Every node drained mid-run: the start is tried again (an undrain brings them back) and
    the error names the drain; it said the node that offered them was gone, and that no node
    had tags [] for a stage that asks for none."""
    hosts = EngineHosts([Host("n1", "tcp://n1:1"), Host("n2", "tcp://n2:1")])
    hosts.pick("render")
    hosts.hosts = [replace(h, draining=True) for h in hosts.hosts]
    with pytest.raises(NoNodeNow) as drained:
        hosts.pick("render")
    said = str(drained.value)
    assert "every node that could take it is draining (n1, n2: troupe ctl undrain NODE)" in said, said
    assert "is gone" not in said and "no node has tags" not in said and _may_pass(drained.value)
