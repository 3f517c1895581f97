"""A node stops the workers it spawned for an owner that is gone: the replicas of a `troupe run
--cluster` killed with SIGKILL ran on for ever on the cluster's nodes, and its rerun failed ("a
worker named 'nav-plan-1' already runs"). Real node and workers in this process, on loopback;
the owners are the node's own endpoint (it answers) and an endpoint nobody listens on.
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.fake_clock import Clock
from support.local_node import running_node
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.errors import AskTimeout, ConfigError
from troupe.runtime.node import spawn_owners
from troupe.runtime.node.config import ActorSpec, NodeConfig
from troupe.runtime.node.node import Node
from troupe.runtime.owned_controls import can_ping_back, spawn_owner
from troupe.runtime.process_identity import process_identity
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.master.run_owners import RunOwners
from troupe.runtime.testing.plugin import free_endpoint

pytestmark = pytest.mark.anyio

ECHO = ActorSpec(name="echo", cls="troupe.actors.demo.actors:Echo")
WAIT_S = 60


@pytest.fixture(autouse=True)
def short_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Short, as a look pings nobody for that long; long enough for the node itself to answer
    # on a loaded machine (0.3 s once missed both looks under a parallel suite).
    monkeypatch.setattr(spawn_owners, "PING_TIMEOUT_S", 2.0)


def _node(tmp_path: Path) -> AbstractAsyncContextManager[Node]:
    cfg = NodeConfig(
        name="own", endpoint=free_endpoint(), log_dir=tmp_path, log_level="warning", stop_grace_s=5.0
    )
    return running_node(cfg)


async def _spawn(node: Node, name: str, owner: str | None, owner_process: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "actors": [ECHO.model_dump(by_alias=True)]}
    if owner is not None:
        spec["owner"] = owner
    if owner_process:
        spec["owner_process"] = owner_process
    with anyio.fail_after(WAIT_S):
        return await node._spawn_worker(spec)


def _running(node: Node, name: str) -> bool:
    return node.workers[name].describe()["state"] == "running"


async def test_the_workers_of_an_owner_gone_are_stopped_after_its_misses(tmp_path: Path) -> None:
    gone = free_endpoint()
    async with _node(tmp_path) as node:
        assert node.runtime is not None
        await _spawn(node, "orphan", gone)
        await _spawn(node, "owned", node.runtime.address)
        await _spawn(node, "operators", None)
        node.owners.misses = 2
        with anyio.fail_after(WAIT_S):
            await node.owners.look()
            assert _running(node, "orphan")  # one miss: maybe a busy owner
            await node.owners.look()
        assert not _running(node, "orphan") and node.workers["orphan"].returncode is not None
        assert _running(node, "owned") and _running(node, "operators")


async def test_a_spawn_takes_the_name_of_a_worker_whose_owner_is_gone(tmp_path: Path) -> None:
    async with _node(tmp_path) as node:
        assert node.runtime is not None
        await _spawn(node, "nav-plan-1", free_endpoint())  # the run killed
        first_pid = node.workers["nav-plan-1"].pid
        await _spawn(node, "nav-plan-1", node.runtime.address)  # its rerun
        assert _running(node, "nav-plan-1") and node.workers["nav-plan-1"].pid != first_pid
        with pytest.raises(ConfigError, match="a worker named 'nav-plan-1' already runs") as taken:
            await _spawn(node, "nav-plan-1", free_endpoint())  # its owner answers: a live run's
        assert f"started by {node.runtime.address} (another run of this pipeline?)" in str(taken.value)


def _dead_process() -> str:
    """The identity of a process of this host that ran and was reaped (a run killed here)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process_identity(child.pid)
    child.wait(timeout=WAIT_S)
    assert identity
    return identity


async def test_an_owner_whose_process_is_gone_on_this_host_is_gone_at_once(tmp_path: Path) -> None:
    """A run killed on the node's host: its replicas are stopped at the watch's next look, not
    after its misses (20 s), and its rerun takes their names without a ping's wait. Its
    process decides, whatever answers at its endpoint now (here the node itself)."""
    async with _node(tmp_path) as node:
        assert node.runtime is not None
        killed = _dead_process()
        await _spawn(node, "nav-plan-1", node.runtime.address, killed)
        first_pid = node.workers["nav-plan-1"].pid
        await _spawn(node, "nav-plan-1", free_endpoint(), process_identity())  # its rerun
        assert _running(node, "nav-plan-1") and node.workers["nav-plan-1"].pid != first_pid
        await _spawn(node, "orphan", node.runtime.address, killed)
        await _spawn(node, "owned", node.runtime.address, process_identity())  # this process lives
        with anyio.fail_after(WAIT_S):
            await node.owners.look()  # one look, where misses are 4
        assert not _running(node, "orphan") and node.workers["orphan"].returncode is not None
        assert _running(node, "owned") and _running(node, "nav-plan-1")


async def test_a_drained_replica_its_run_stopped_is_not_started_again_by_an_undrain(tmp_path: Path) -> None:
    async with _node(tmp_path) as node:
        assert node.runtime is not None
        await _spawn(node, "nav-render-4", node.runtime.address)
        with anyio.fail_after(WAIT_S):
            await node._stop_worker({"name": "nav-render-4"})  # as a drain does
        node.drained.add("nav-render-4")
        with anyio.fail_after(WAIT_S):
            assert await node._stop_worker({"name": "nav-render-4"}) is True  # its run, at its end
        assert "nav-render-4" not in node.drained


@pytest.mark.parametrize(
    ("node", "owner", "watched"),
    [
        ("tcp://127.0.0.2:7470", "tcp://127.0.0.1:40000", True),  # one host (loopback "hosts")
        ("tcp://10.0.0.2:7470", "tcp://10.0.0.1:40000", True),  # hosts that reach each other
        ("tcp://127.0.0.1:7470", "tcp://10.0.0.1:40000", True),
        ("tcp://10.0.0.2:7470", "tcp://127.0.0.1:40000", False),  # it would ping its own loopback
    ],
)
def test_a_run_names_itself_owner_only_where_the_node_can_ping_it_back(
    node: str, owner: str, watched: bool
) -> None:
    """A run binds loopback by default. A node on another host (or network namespace) pinging
    that address finds nobody on its own loopback and would stop a healthy run's replicas."""
    assert can_ping_back(node, owner) is watched


class _Master:
    """The master as the node's watch asks it: ``owner_seen`` answers the next silence given
    (an exception to raise instead: a master that does not answer)."""

    def __init__(self, *answers: float | Exception) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def control(
        self, endpoint: str, msg_type: str, payload: Any = None, *, timeout: float = 5.0
    ) -> Any:
        assert msg_type == "owner_seen" and payload["owner"].startswith("master:")
        self.asked += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return {"silent_s": answer}


def _watch(master: _Master, stopped: list[str], with_master: bool = True) -> spawn_owners.OwnerWatch:
    async def stop(name: str) -> None:
        stopped.append(name)

    return spawn_owners.OwnerWatch(master, {}, stop, master="tcp://m:1" if with_master else None)  # type: ignore[arg-type]


@pytest.fixture
def quick_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawn_owners, "_VERDICT_POLL_S", 0.0)


@pytest.mark.usefixtures("quick_verdicts")
async def test_a_run_the_master_vouches_for_is_gone_once_silent_past_the_bound() -> None:
    """A cluster run listens on its own host's loopback: the node asks the master, and waits
    for a verdict (a rerun's request for the name): a beat first is a run that lives."""
    bound = spawn_owners.OWNER_SILENT_S
    with anyio.fail_after(WAIT_S):
        assert await _watch(_Master(bound - 1, bound + 1), []).gone("master:k")  # killed: silence grew
        beat = _Master(bound - 1, bound - 0.5, 0.2)
        assert not await _watch(beat, []).gone("master:l") and beat.asked == 3  # it beat since
        assert not await _watch(_Master(AskTimeout("restarting")), []).gone("master:m")  # cannot say
        assert not await _watch(_Master(bound + 5), [], with_master=False).gone("master:n")


async def test_the_watch_stops_the_workers_of_a_run_the_master_has_not_heard_from() -> None:
    bound = spawn_owners.OWNER_SILENT_S
    for answer, expected in ((bound + 1, ["r-1", "r-2"]), (bound - 1, []), (AskTimeout("down"), [])):
        stopped: list[str] = []
        with anyio.fail_after(WAIT_S):
            await _watch(_Master(answer), stopped)._look_at("master:k", ["r-1", "r-2"])
        assert stopped == expected, answer


async def test_a_real_master_vouches_and_the_node_stops_the_killed_runs_replicas(tmp_path: Path) -> None:
    """Real master and node: a run's replica whose owner the master has not heard from past the
    bound is stopped by the node's watch, and its rerun takes its name; a run that beats keeps
    its replica, and an operator's worker (no owner) is never stopped."""
    clock = Clock()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    master = Master(MasterConfig(endpoint=free_endpoint(), tick_s=0.05), journal, book)
    master.run_owners = RunOwners(clock)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(master.run)
            with anyio.fail_after(WAIT_S):
                await master.ready.wait()
            cfg = NodeConfig(
                name="own", endpoint=free_endpoint(), log_dir=tmp_path, log_level="warning",
                stop_grace_s=5.0, master=master.config.endpoint,
            )  # fmt: skip
            async with running_node(cfg) as node:
                assert node.runtime is not None
                beat = {"owner": "master:killed"}
                await node.runtime.control(master.config.endpoint, "owner_beat", beat)
                await _spawn(node, "nav-plan-1", "master:killed")
                await _spawn(node, "operators", None)
                clock.now += spawn_owners.OWNER_SILENT_S + 5  # the run was killed: no beat since
                await node.runtime.control(master.config.endpoint, "owner_beat", {"owner": "master:rerun"})
                await _spawn(node, "nav-plan-2", "master:killed")
                with anyio.fail_after(WAIT_S):
                    await node.owners.look()
                assert node.workers["nav-plan-2"].returncode is not None
                await _spawn(node, "nav-plan-1", "master:rerun")  # the rerun takes the name
                assert _running(node, "nav-plan-1") and node.workers["nav-plan-1"].owner == "master:rerun"
                with anyio.fail_after(WAIT_S):
                    await node.owners.look()
                assert _running(node, "nav-plan-1") and _running(node, "operators")
            master.stop()
    finally:
        journal.close()


async def test_the_connection_to_an_owner_goes_once_it_owns_no_running_worker(tmp_path: Path) -> None:
    """Each `troupe run --cluster` that outlived one look left the node a connection to the
    run (its pings'), for the node's life: a long-lived node ran out of sockets. The owner is a
    runtime of its own here, which only the owner watch dials (the node's other connections,
    to its supervisor and workers, come and go as they will)."""
    async with _node(tmp_path) as node, process_runtime("elsewhere", "run") as run:

        async def ping(_: Any) -> dict[str, Any]:
            return {"pid": 0}

        run.register_control("ping", ping)
        assert node.runtime is not None
        dealers = node.runtime.transport._dealers  # type: ignore[attr-defined]
        await _spawn(node, "replica", run.address)
        with anyio.fail_after(WAIT_S):
            await node.owners.look()
            assert run.address in dealers and _running(node, "replica")
            await node._stop_named("replica")  # the run ended: it stopped its replicas
            await node.owners.look()
        assert run.address not in dealers


class _Beat:
    """A run's beat to its master, which took one (``owner_beat.OwnerBeat``)."""

    vouched = True
    token = "master:client/pipeline-7"


@pytest.mark.parametrize(
    ("node", "owner"),
    [
        ("tcp://10.0.0.2:7470", "tcp://10.0.0.3:40000"),  # a cluster run off its master's host
        ("tcp://10.0.0.2:7470", "tcp://127.0.0.1:40000"),
    ],
)
def test_a_node_on_another_host_asks_the_master_about_a_run_it_could_ping(node: str, owner: str) -> None:
    """A cluster run listens on its host's address towards the master (run_keys.py): a node
    pinging it there, through a workstation's firewall, would stop the replicas of a run that
    is well. The nodes on its own host ping it, as before."""
    assert spawn_owner(node, owner, _Beat()) == _Beat.token  # type: ignore[arg-type]
    assert spawn_owner("tcp://127.0.0.2:7470", "tcp://127.0.0.1:40000", _Beat()) == "tcp://127.0.0.1:40000"  # type: ignore[arg-type]
    assert spawn_owner(node, "tcp://10.0.0.3:40000", None) == "tcp://10.0.0.3:40000"  # no master to ask
