"""A pipeline across hosts: replicas on three network-namespace hosts, and one host killed mid-run.

A master runs on the first host (tests/support/netns.py) and a node on each of three (n1 tagged
``store``); ``troupe run PIPE --cluster MASTER --nodes 3 --json`` runs inside the first host and
places every stage replica on the master's nodes: the store stage only on n1 (its tag), render's
three replicas wherever the least load is. ``--out`` is under tmp_path: the namespaces share the
file system, so it stands in for the dataset's host. Done when (issue 14): the run writes one
LeRobot dataset with every episode once, and a node killed mid-run loses no episode.

These tests skip, saying why, only where namespaces cannot be made (not root, no ``ip``, a
kernel that refuses). Every process is killed by its pid, children too, then the namespaces
are deleted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from support.netns import lan, netns_unavailable
from support.netns_pipeline import (
    NODES,
    NetPipeline,
    committed,
    dataset_episodes,
    markers,
    pipeline_toml,
    run_events,
)

_WHY_NOT = netns_unavailable()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or ""),
]

RUN_TIMEOUT_S = 420.0
WAIT_S = 180.0


@pytest.fixture
def netpipe(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NetPipeline]:
    """A master and three nodes on three hosts, every node alive; all reaped at the end.

    The master declares a silent node dead after 3 s, or after ``request.param`` seconds.
    """
    node_timeout_s = float(getattr(request, "param", 3.0))
    with lan(len(NODES), tag="p") as net:
        cluster = NetPipeline(net, tmp_path)
        try:
            cluster.start_cluster(node_timeout_s)
            cluster.wait_nodes_alive(WAIT_S)
            yield cluster
        finally:
            assert not cluster.stop(), "processes survived the test"


def _seed(task_id: str) -> int:
    return int(task_id.rsplit("-", 1)[1])


def _check_every_episode_once(out: Path, result: dict[str, Any], items: int) -> None:
    """Every item ok, and the dataset under ``out`` holds each item's episode exactly once."""
    counts = result["items"]
    assert counts["ok"] == items and not counts["dead"] and not counts["pruned"], counts
    episodes = dataset_episodes(out)
    assert len(episodes) == len(set(episodes)) == items, sorted(episodes)
    assert sorted(_seed(t) for t in episodes) == list(range(items))
    assert sorted(episodes) == committed(out)  # the dataset is what the writer committed


def _replicas_of(placement: dict[str, str], stage: str) -> dict[str, str]:
    # A replica is named PIPELINE-STAGE-N (the pipeline's name may hold dashes, a stage's not).
    return {replica: node for replica, node in placement.items() if replica.rsplit("-", 2)[-2] == stage}


def test_a_pipeline_runs_with_replicas_on_three_hosts_and_writes_every_episode_once(
    netpipe: NetPipeline, tmp_path: Path
) -> None:
    """`troupe run --cluster` places replicas on all three hosts (the store only on the one
    tagged store) and writes one dataset holding every item's episode exactly once."""
    items = 18
    pipeline, out = tmp_path / "datagen-3hosts.toml", tmp_path / "out"
    pipeline.write_text(pipeline_toml("netns-a", items))
    result = netpipe.run_json(netpipe.run(pipeline, out), RUN_TIMEOUT_S)

    placement = result["placement"]
    assert set(placement.values()) == set(NODES), placement  # replicas on every host
    store = _replicas_of(placement, "store")
    assert store and set(store.values()) == {"n1"}, placement  # the tag pins the writer
    # A stage's replicas spread over the nodes before any node gets a second one.
    assert set(_replicas_of(placement, "render").values()) == set(NODES), placement
    _check_every_episode_once(out, result, items)


def test_a_node_killed_mid_run_loses_no_episode(netpipe: NetPipeline, tmp_path: Path) -> None:
    """A node SIGKILLed while its render replica holds an item, with episodes committed already:
    the run still ends with every item ok and every episode in the dataset exactly once."""
    items, held_from = 24, 6
    pipeline, out, gate = tmp_path / "datagen-kill.toml", tmp_path / "out", tmp_path / "gate"
    gate.mkdir()
    # Render holds seeds 6 and up at the gate, on every node: the run cannot end before the
    # test opens it, and each held item says which node holds it. Items reach render in seed
    # order, so seeds 0 to 5 pass before any replica is held.
    pipeline.write_text(pipeline_toml("netns-b", items, gate=gate, from_seed=held_from, hold_render_on=NODES))
    run = netpipe.run(pipeline, out)

    def n3_holds_an_item() -> bool:
        # Every seed before the gate committed first: n3 then holds no frames a writer still
        # has to take, only the call it has not answered (frames held: the next test).
        done = len(committed(out)) == held_from
        return done and any(node == "n3" for _, node in markers(gate, "waiting-render"))

    _wait_mid_run(netpipe, run, out, gate, n3_holds_an_item, "a render replica on n3 holding an item")
    assert [_seed(t) for t in committed(out)] == list(range(held_from))  # the held items are not done

    # SIGKILL: its workers die with it, and the item its render replica held with them.
    assert not netpipe.kill_node("n3", WAIT_S), "n3's workers outlived it"
    (gate / "open").touch()
    result = netpipe.run_json(run, RUN_TIMEOUT_S)

    assert "n3" in set(result["placement"].values()), result["placement"]
    # The call n3's replica never answered failed with its node, and its item ran elsewhere.
    assert result["stages"]["render"]["errors"] >= 1, result["stages"]["render"]
    _check_every_episode_once(out, result, items)


def _start_with_frames_held_on_n3(
    netpipe: NetPipeline, tmp_path: Path, name: str, items: int, held_from: int
) -> tuple[Any, Path, Path]:
    """Start a run whose writer (n1) holds seed ``held_from`` at the gate, as do render's
    replicas on n1 and n2: from then on only n3 renders, and what it renders waits there for
    the writer to take it. Returns when n3 holds frames (the run, its out, the gate)."""
    pipeline, out, gate = tmp_path / f"{name}.toml", tmp_path / "out", tmp_path / "gate"
    gate.mkdir()
    pipeline.write_text(
        pipeline_toml(
            name, items, gate=gate, from_seed=held_from, hold_render_on=("n1", "n2"), hold_store=True
        )
    )
    run = netpipe.run(pipeline, out)

    def held_on_n3() -> set[int]:
        taken = {seed for seed, _ in markers(gate, "taken")}
        return {seed for seed, node in markers(gate, "rendered") if node == "n3"} - taken

    def n3_holds_frames() -> bool:
        # The writer takes one item per call and answers one call at a time: while it waits at
        # the gate it takes nothing, and a seed rendered on n3 that it has not taken is held there.
        return bool(markers(gate, "waiting-store")) and bool(held_on_n3())

    _wait_mid_run(netpipe, run, out, gate, n3_holds_frames, "frames rendered on n3 waiting for the writer")
    assert not {_seed(t) for t in committed(out)} & held_on_n3(), (committed(out), held_on_n3())
    return run, out, gate


def test_frames_held_on_a_killed_node_are_made_again(netpipe: NetPipeline, tmp_path: Path) -> None:
    """A node SIGKILLed while it holds rendered frames the writer has not taken yet (the direct
    data plane keeps them where they were made): once the engine has seen the node go, those
    items run again from the first stage, and the dataset has every episode exactly once."""
    items = 24
    run, out, gate = _start_with_frames_held_on_n3(netpipe, tmp_path, "netns-c", items, held_from=6)

    assert not netpipe.kill_node("n3", WAIT_S), "n3's workers outlived it"
    deadline = time.monotonic() + WAIT_S
    while not any(e.get("event_node") == "n3" for e in run_events(out, "replica_node_lost")):
        assert run.poll() is None, f"the run ended before it saw n3 go; {netpipe.log_tail('run')}"
        assert time.monotonic() < deadline, f"the run did not see n3 go within {WAIT_S}s"
        time.sleep(0.1)
    (gate / "open").touch()  # the writer goes on only now, after the engine saw n3 go
    result = netpipe.run_json(run, RUN_TIMEOUT_S)

    assert "n3" in set(result["placement"].values()), result["placement"]
    assert result["restarted"] >= 1, {k: result[k] for k in ("restarted", "items", "placement")}
    _check_every_episode_once(out, result, items)


@pytest.mark.parametrize("netpipe", [10.0], indirect=True)  # the master's default node timeout
def test_frames_asked_of_a_node_just_killed_are_made_again(netpipe: NetPipeline, tmp_path: Path) -> None:
    """The writer asks a node SIGKILLed a moment before for the frames it holds, before the
    master has declared the node dead (10 s of silence): the ask fails, those items run again
    from the first stage, and the dataset has every episode exactly once."""
    items = 24
    run, out, gate = _start_with_frames_held_on_n3(netpipe, tmp_path, "netns-d", items, held_from=6)

    assert not netpipe.kill_node("n3", WAIT_S), "n3's workers outlived it"
    (gate / "open").touch()  # the writer goes on at once: its next items are held on dead n3
    result = netpipe.run_json(run, RUN_TIMEOUT_S)

    assert "n3" in set(result["placement"].values()), result["placement"]
    assert result["restarted"] >= 1, {k: result[k] for k in ("restarted", "items", "placement")}
    _check_every_episode_once(out, result, items)


def _replica_processes(pipeline: str) -> list[int]:
    """The pids of the replicas of ``pipeline`` running on this machine (on any host)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if f"troupe worker {pipeline}-" in " ".join(proc.cmdline()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_a_killed_runs_replicas_are_stopped_by_their_nodes_and_its_rerun_finishes(
    netpipe: NetPipeline, tmp_path: Path
) -> None:
    """A cluster run listens on its own host's loopback: the nodes, on other hosts, could not
    ping it, and a run killed with SIGKILL left its replicas running for good, its rerun refused
    (``a worker named ... already runs``). It beats to the master, which the nodes ask: they
    stop its replicas once the master has not heard from it for 20 s, and the same command
    finishes, every episode once."""
    items, held_from = 12, 4
    pipeline, out, gate = tmp_path / "datagen-killed.toml", tmp_path / "out", tmp_path / "gate"
    gate.mkdir()
    pipeline.write_text(pipeline_toml("netns-e", items, gate=gate, from_seed=held_from, hold_render_on=NODES))
    run = netpipe.run(pipeline, out)
    _wait_mid_run(
        netpipe, run, out, gate, lambda: bool(markers(gate, "waiting-render")), "render holding an item"
    )
    assert _replica_processes("netns-e")
    run.kill()
    run.wait(timeout=WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while left := _replica_processes("netns-e"):
        assert time.monotonic() < deadline, f"the killed run's replicas {left} still run after {WAIT_S}s"
        time.sleep(0.5)
    (gate / "open").touch()
    result = netpipe.run_json(netpipe.run(pipeline, out), RUN_TIMEOUT_S)
    assert not result["items"]["dead"] and not result["items"]["pruned"], result["items"]
    episodes = dataset_episodes(out)  # the killed run's committed episodes, and the rerun's
    assert len(episodes) == len(set(episodes)) == items and sorted(episodes) == committed(out)


def _wait_mid_run(
    netpipe: NetPipeline, run: Any, out: Path, gate: Path, ready: Callable[[], bool], what: str
) -> None:
    """Poll (bounded) until some episodes are committed and ``ready()``; the run must not end."""
    deadline = time.monotonic() + WAIT_S
    while True:
        assert run.poll() is None, f"the run ended before n3 was killed; {netpipe.log_tail('run')}"
        netpipe.note_descendants()
        if committed(out) and ready():
            return
        assert time.monotonic() < deadline, (
            f"not {what}, with episodes committed, within {WAIT_S}s: committed {committed(out)}, "
            f"markers {sorted(p.name for p in gate.iterdir())}"
        )
        time.sleep(0.1)
