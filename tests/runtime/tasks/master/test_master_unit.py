"""The master with real TaskGetters over the in-memory transport: the whole protocol, fast."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog.testing

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import JournalError, TaskError, UnknownWorker
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.getter_start import install_task_control
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import HELD_S, Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.master.nodes import FORGET_DEAD_S, NodeTable
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.transports.base import MemoryHub

MASTER = "mem://master"
Runner = Callable[[LeasedTask], Awaitable[str | None]]


@dataclass
class Cluster:
    hub: MemoryHub
    tmp: Path
    master: Master
    getters: dict[str, TaskGetter] = field(default_factory=dict)
    runtimes: dict[str, Runtime] = field(default_factory=dict)

    async def call(self, msg_type: str, payload: Any = None, timeout: float = 5.0) -> Any:
        return await self.runtimes["client"].control(MASTER, msg_type, payload, timeout=timeout)

    async def submit(self, name: str, count: int, **job: Any) -> None:
        await self.call(
            "submit", {"job": {"job": {"name": name, "kind": "k", "count": count, **job}}, "source": "test"}
        )

    async def wait(self, job_id: str, timeout: float = 10.0) -> dict[str, Any]:
        return await self.call("wait_job", {"job_id": job_id, "timeout_s": timeout}, timeout + 5)


async def until(condition: Callable[[], Any]) -> None:
    """A bounded poll of a condition, yielding to the loop between looks."""
    with anyio.fail_after(10):
        while not condition():
            await anyio.sleep(0.001)


class FakeClock:
    """The master's monotonic clock, driven by the test: time passes only when it says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@asynccontextmanager
async def cluster(
    tmp_path: Path,
    node_timeout_s: float = 10.0,
    clock: FakeClock | None = None,
) -> AsyncIterator[Cluster]:
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    master = Master(
        MasterConfig(tick_s=0.01, node_timeout_s=node_timeout_s),
        journal,
        book,
        transport=hub.transport(name="master"),
        **({"clock": clock} if clock is not None else {}),
    )
    c = Cluster(hub, tmp_path, master)
    async with anyio.create_task_group() as tg:
        tg.start_soon(master.run)
        await master.ready.wait()
        async with Runtime("client", "client", hub.transport()) as client:
            c.runtimes["client"] = client
            yield c
            master.stop()
            tg.cancel_scope.cancel()
    journal.close()


@asynccontextmanager
async def workers(c: Cluster, node: str, n: int, runner: Runner, **cfg: Any) -> AsyncIterator[Runtime]:
    """``n`` getters of node ``node`` sharing one runtime (one worker process)."""
    async with Runtime(node, "w", c.hub.transport()) as rt:
        c.runtimes[node] = rt
        install_task_control(rt, c.getters)
        options = {"wait_s": 0.3, "call_timeout_s": 1.0, "retry_s": 0.02, **cfg}
        for i in range(n):
            getter = TaskGetter(rt, MASTER, GetterConfig(f"{node}/w{i}", node, **options), runner)
            c.getters[getter.worker_id] = getter
            rt.start_soon(getter.run)
        yield rt


def quick(ran: Counter[str]) -> Runner:
    async def run(task: LeasedTask) -> str:
        ran[task.task_id] += 1
        await anyio.lowlevel.checkpoint()
        return f"out/{task.task_id}"

    return run


def blocking(started: list[str], release: anyio.Event) -> Runner:
    async def run(task: LeasedTask) -> str:
        started.append(task.task_id)
        await release.wait()
        return "out"

    return run


async def test_every_task_runs_once_and_reports_carry_the_next_request(tmp_path: Path) -> None:
    """A job's tasks each run once; reports piggyback requests, so few separate requests are made."""
    ran: Counter[str] = Counter()
    async with cluster(tmp_path) as c, workers(c, "n1", 4, quick(ran)):
        await until(lambda: len(c.master.workers()) == 4)
        await c.submit("j", 300)
        job = await c.wait("j")
        status = await c.call("status")
    assert job["state"] == "done" and job["counts"]["done"] == 300
    assert len(ran) == 300 and set(ran.values()) == {1}
    requests = sum(g.statistics().requests for g in c.getters.values())
    assert requests < 100  # most tasks came with the previous task's report
    assert status["throughput"]["done_since_start"] == 300
    assert {w["worker_id"] for w in status["workers"]} == {f"n1/w{i}" for i in range(4)}


async def test_cancel_job_stops_the_running_copies(tmp_path: Path) -> None:
    """Cancelling a job cancels its pending tasks and tells each worker to stop its copy."""
    started: list[str] = []
    release = anyio.Event()
    async with cluster(tmp_path) as c, workers(c, "n1", 2, blocking(started, release)):
        await c.submit("c", 5)
        await until(lambda: len(started) == 2)
        await c.call("cancel", {"job_id": "c"})
        await until(lambda: sum(g.statistics().cancelled for g in c.getters.values()) == 2)
        job = await c.wait("c")
        with pytest.raises(TaskError, match="already ended"):
            await c.call("cancel", {"job_id": "c"})
    assert job["state"] == "cancelled" and job["counts"]["cancelled"] == 5


async def test_drain_gives_no_new_task_and_tells_the_node_when_idle(tmp_path: Path) -> None:
    """A draining node finishes what it holds, gets nothing new, then hears master_drained."""
    started: list[str] = []
    release = anyio.Event()
    drained = anyio.Event()
    async with cluster(tmp_path) as c, Runtime("n1", "node", c.hub.transport()) as node_rt:

        async def master_drained(payload: Any) -> bool:
            drained.set()
            return True

        node_rt.register_control("master_drained", master_drained)
        await node_rt.control(
            MASTER, "node_beat", {"node": "n1", "endpoint": node_rt.address, "resources": {"cpus": 2}}
        )
        async with workers(c, "n1", 1, blocking(started, release)):
            await c.submit("d", 3)
            await until(lambda: len(started) == 1)
            await c.call("drain", {"node": "n1"})
            release.set()
            with anyio.fail_after(5):
                await drained.wait()
            status = await c.call("status")
    assert started == ["d-000000"]
    assert status["tasks"]["done"] == 1 and status["tasks"]["pending"] == 2
    assert [(n["node"], n["draining"]) for n in status["nodes"]] == [("n1", True)]  # ctl status shows it


async def test_a_beat_that_says_drained_drains_the_node_unless_an_undrain_ended_it_since(
    tmp_path: Path,
) -> None:
    """A master that restarted knows no drain: a drained node's beat tells it, and it shows
    the node draining (and tells it drained). A beat the node sent before it took the
    master's undrain is stale: it does not drain the node again."""
    told: list[str] = []
    async with cluster(tmp_path) as c, Runtime("n1", "node", c.hub.transport()) as node_rt:

        async def master_drained(payload: Any) -> list[str]:
            told.append("drained")
            return []

        async def master_undrained(payload: Any) -> list[str]:
            told.append(payload["token"])
            return []

        node_rt.register_controls({"master_drained": master_drained, "master_undrained": master_undrained})
        beat = {"node": "n1", "endpoint": node_rt.address, "resources": {}, "drained": True}
        with structlog.testing.capture_logs() as first:
            await node_rt.control(MASTER, "node_beat", beat)
            await node_rt.control(MASTER, "node_beat", beat)  # before the drain landed: the same drain
            await until(lambda: told == ["drained"])
        (learned,) = (await c.call("status"))["nodes"]
        await c.call("undrain", {"node": "n1"})
        token = told[1]
        with structlog.testing.capture_logs() as logs:
            await node_rt.control(MASTER, "node_beat", beat)  # sent before the node took the undrain
            await node_rt.control(MASTER, "node_beat", {**beat, "drained": False, "undrain_token": token})
        (undrained,) = (await c.call("status"))["nodes"]
    assert learned["draining"] is True and undrained["draining"] is False
    assert [e["event"] for e in first if e["event"] == "node_says_drained"] == ["node_says_drained"]
    assert not [e for e in logs if e["event"] == "node_says_drained"]


def _undrain_recorder(node_rt: Runtime, told: list[str]) -> None:
    """The node's ``master_drained`` and ``master_undrained``, each recorded in ``told``."""

    async def master_drained(payload: Any) -> list[str]:
        told.append("drained")
        return []

    async def master_undrained(payload: Any) -> list[str]:
        told.append(payload["token"])
        return ["n1/w0"]

    node_rt.register_controls({"master_drained": master_drained, "master_undrained": master_undrained})


async def test_an_undrain_of_a_stopped_node_asks_it_nothing_and_says_it_is_stopped(tmp_path: Path) -> None:
    """mt 3: the master asked a stopped node (still listed) its undrain and waited 10 s; the
    undrain had taken effect, yet the CLI said the master was hung. Now it answers at once,
    saying the node is stopped; started again (not drained: its drain was the master's), the
    node takes tasks."""
    told: list[str] = []
    async with cluster(tmp_path) as c, Runtime("n1", "node", c.hub.transport()) as node_rt:
        _undrain_recorder(node_rt, told)  # a stopped node answers nothing: any ask of it is a fault
        beat = {"node": "n1", "endpoint": node_rt.address, "resources": {}}
        await node_rt.control(MASTER, "node_beat", beat)
        await c.call("drain", {"node": "n1"})
        await until(lambda: told == ["drained"])
        assert await c.call("node_left", {"node": "n1"}) is True
        reply = await c.call("undrain", {"node": "n1"})
        (stopped,) = (await c.call("status"))["nodes"]
        with structlog.testing.capture_logs() as logs:
            await node_rt.control(MASTER, "node_beat", {**beat, "drained": False})  # started again
        (started,) = (await c.call("status"))["nodes"]
    assert reply == {"node": "n1", "draining": False, "restarted": [], "state": "stopped"}
    assert told == ["drained"]
    assert (stopped["left"], stopped["draining"]) == (True, False)
    assert (started["alive"], started["draining"]) == (True, False)
    assert not c.master.nodes.owes_undrain("n1")
    assert not [e for e in logs if e["event"] in ("node_says_drained", "owed_undrain_told")]


async def test_a_dead_node_undrained_meanwhile_is_told_at_its_next_beat_not_drained_again(
    tmp_path: Path,
) -> None:
    """A drained node that went silent (a cut link) is dead to the master; undrained then, it
    is not asked (nothing answers), and when it comes back still drained its beat gets the
    undrain rather than draining it again (the operator's undrain would be lost so)."""
    told: list[str] = []
    clock = FakeClock()
    async with (
        cluster(tmp_path, node_timeout_s=10.0, clock=clock) as c,
        Runtime("n1", "node", c.hub.transport()) as node_rt,
    ):
        _undrain_recorder(node_rt, told)
        beat = {"node": "n1", "endpoint": node_rt.address, "resources": {}, "drained": True}
        await node_rt.control(MASTER, "node_beat", beat)
        await until(lambda: told == ["drained"])
        clock.advance(11.0)
        await c.master.tick()
        reply = await c.call("undrain", {"node": "n1"})
        asked_while_dead = list(told)
        with structlog.testing.capture_logs() as logs:
            await node_rt.control(MASTER, "node_beat", beat)  # back, still drained
            await until(lambda: len(told) == 2)
            await until(lambda: not c.master.nodes.owes_undrain("n1"))
            await node_rt.control(MASTER, "node_beat", {**beat, "drained": False, "undrain_token": told[1]})
        (n1,) = (await c.call("status"))["nodes"]
    assert reply == {"node": "n1", "draining": False, "restarted": [], "state": "dead"}
    assert asked_while_dead == ["drained"]
    assert (n1["alive"], n1["draining"]) == (True, False)
    events = [e["event"] for e in logs if e["event"] in ("node_says_drained", "owed_undrain_told")]
    assert events == ["owed_undrain_told"]


async def test_an_undrain_a_live_node_does_not_take_holds_and_is_told_at_its_next_beat(
    tmp_path: Path,
) -> None:
    """A live node that fails the undrain's ask (here: it has no handler yet) does not fail the
    undrain, which holds in the book: the reply says why it was not told, and the node's next
    beat that says it is drained gets it."""
    told: list[str] = []
    async with cluster(tmp_path) as c, Runtime("n1", "node", c.hub.transport()) as node_rt:
        beat = {"node": "n1", "endpoint": node_rt.address, "resources": {}, "drained": True}
        await node_rt.control(MASTER, "node_beat", beat)
        await until(lambda: "n1" in c.master.book.draining_nodes())
        reply = await c.call("undrain", {"node": "n1"})
        _undrain_recorder(node_rt, told)
        await node_rt.control(MASTER, "node_beat", beat)
        await until(lambda: told)
        (n1,) = (await c.call("status"))["nodes"]
    assert reply["state"] == "alive" and reply["restarted"] == []
    assert "master_undrained" in reply["not_told"]
    assert len(told) == 1 and told[0] != "drained"  # the undrain, and no drain again
    assert n1["draining"] is False


async def test_a_beat_is_answered_with_the_masters_node_timeout(tmp_path: Path) -> None:
    """The node waits for a beat's reply a share of it (nw 2): over a slow link the replies
    come late, and a bound of one second made every beat fail at the node."""
    async with cluster(tmp_path, node_timeout_s=42.0) as c:
        reply = await c.call("node_beat", {"node": "n1", "endpoint": "mem://n1", "resources": {}})
    assert reply["ok"] is True and reply["node_timeout_s"] == 42.0


async def test_a_silent_node_is_dead_and_its_tasks_run_elsewhere(tmp_path: Path) -> None:
    """When a node stops beating, the tasks its workers hold are requeued and done elsewhere.

    The master's clock is driven: the node falls silent when the test moves time past the
    node timeout, not after a real wait.
    """
    stuck: list[str] = []
    ran: Counter[str] = Counter()
    clock = FakeClock()
    async with cluster(tmp_path, node_timeout_s=10.0, clock=clock) as c:
        await c.call("node_beat", {"node": "n1", "endpoint": "mem://gone", "resources": {}})
        async with workers(c, "n1", 1, blocking(stuck, anyio.Event())):
            await c.submit("x", 4)
            await until(lambda: len(stuck) == 1)
            clock.advance(9.0)
            await c.master.tick()
            assert [n["alive"] for n in (await c.call("status"))["nodes"]] == [True]
            clock.advance(1.5)  # silent for longer than node_timeout_s now
            await c.master.tick()
            async with workers(c, "n2", 1, quick(ran)):
                job = await c.wait("x")
                status = await c.call("status")
    assert job["state"] == "done"
    assert stuck[0] in ran  # the dead node's task ran on n2
    (n1,) = [n for n in status["nodes"] if n["node"] == "n1"]
    assert n1["alive"] is False


async def test_a_node_that_leaves_is_stopped_at_once_and_its_tasks_run_elsewhere(tmp_path: Path) -> None:
    """A node stopped on purpose says node_left: the master marks it left (info, not the
    node_dead warning its silence gave 10 s later), requeues its task then, keeps its drain, and
    does not call it dead once its beats stop.

    The master's clock is driven and never reaches the node timeout before the task ran
    elsewhere: only the leave can have requeued it.
    """
    stuck: list[str] = []
    ran: Counter[str] = Counter()
    clock = FakeClock()
    async with cluster(tmp_path, node_timeout_s=10.0, clock=clock) as c:
        running = {"w0": {"endpoint": "mem://gone/w0", "actors": {}}}
        await c.call(
            "node_beat", {"node": "n1", "endpoint": "mem://gone", "resources": {}, "processes": running}
        )
        async with workers(c, "n1", 1, blocking(stuck, anyio.Event()), report_for_s=0.1):
            await c.submit("x", 2, lease_s=600)
            await until(lambda: len(stuck) == 1)
            await c.call("drain", {"node": "n1"})
            with structlog.testing.capture_logs() as logs:
                assert await c.call("node_left", {"node": "n1"}) is True
                assert await c.call("node_left", {"node": "n1"}) is True  # said twice: once
                clock.advance(30.0)  # silent past the timeout: it left, it is not dead
                await c.master.tick()
            left = (await c.call("status"))["nodes"]
        async with workers(c, "n2", 1, quick(ran)):
            job = await c.wait("x")
        await c.call("node_beat", {"node": "n1", "endpoint": "mem://back", "resources": {}})
        back = (await c.call("status"))["nodes"]
    assert job["state"] == "done" and stuck[0] in ran
    # Its last beat's processes are out of date once it left: none said, as the table's "-".
    assert [(n["node"], n["alive"], n["left"], n["draining"], n["processes"]) for n in left] == [
        ("n1", False, True, True, None)
    ]
    events = [(e["event"], e["log_level"]) for e in logs if e["event"] in ("node_left", "node_dead")]
    assert events == [("node_left", "info")]
    (n1,) = [n for n in back if n["node"] == "n1"]
    assert (n1["alive"], n1["left"], n1["revivals"], n1["draining"]) == (True, False, 0, True)


async def test_worker_left_requeues_at_once_unless_a_newer_incarnation_registered(tmp_path: Path) -> None:
    """worker_left with the registered pid requeues that worker's task; a stale pid is ignored."""
    stuck: list[str] = []
    ran: Counter[str] = Counter()
    async with (
        cluster(tmp_path) as c,
        workers(c, "n1", 1, blocking(stuck, anyio.Event()), report_for_s=0.1),
    ):
        await c.submit("y", 1, lease_s=600)
        await until(lambda: len(stuck) == 1)
        assert await c.call("worker_left", {"worker_id": "n1/w0", "pid": 1, "reason": "x"}) is False
        assert await c.call("worker_left", {"worker_id": "n1/w0", "reason": "killed"}) is True
        async with workers(c, "n2", 1, quick(ran)):
            job = await c.wait("y")
    assert job["state"] == "done" and ran == Counter({"y-000000": 1})


async def test_renewals_keep_a_task_longer_than_its_lease(tmp_path: Path) -> None:
    """A task running three times its lease keeps it by renewing, and runs once. Each renewal
    says the worker's process (a restarted master tells by it a new process of the name, lo 2).

    The master's monotonic clock (its leases' clock) is driven: the task's run moves it on by
    half a lease after each renewal the master answers, six times, and the master looks at once.
    """
    ran: Counter[str] = Counter()
    clock = FakeClock()
    renewals = 0
    pids: set[Any] = set()

    async with cluster(tmp_path, clock=clock) as c:
        runtime = c.master.runtime
        assert runtime is not None
        renew = runtime.unregister_control("renew")

        async def counted(payload: Any) -> Any:
            nonlocal renewals
            pids.add(payload.get("pid"))
            reply = await renew(payload)
            renewals += 1
            return reply

        runtime.register_control("renew", counted)

        async def slow(task: LeasedTask) -> str:
            ran[task.task_id] += 1
            for _ in range(6):  # 6 x 0.1 s of the master's time: three times the lease
                seen = renewals
                await until(lambda seen=seen: renewals > seen)
                clock.advance(0.1)
                await c.master.tick()
            return "out"

        async with workers(c, "n1", 1, slow):
            await c.submit("r", 1, lease_s=0.2)
            job = await c.wait("r")
    assert job["state"] == "done" and ran == Counter({"r-000000": 1})
    assert pids == {os.getpid()}


async def test_a_task_that_always_raises_is_dead_lettered_with_its_traceback(tmp_path: Path) -> None:
    """After max_attempts failures the task is dead, and `dead` gives its error and traceback."""

    async def boom(task: LeasedTask) -> str:
        raise ValueError(f"boom {task.task_id} attempt {task.attempt}")

    async with cluster(tmp_path) as c, workers(c, "n1", 2, boom):
        await c.submit("f", 2, max_attempts=2, backoff_base_s=0.0)
        job = await c.wait("f")
        dead = await c.call("dead", {"job_id": "f"})
    assert job["state"] == "failed" and job["counts"]["dead"] == 2
    assert [d["attempts"] for d in dead] == [2, 2]
    assert dead[0]["error"] == "ValueError: boom f-000000 attempt 2"
    assert "Traceback" in dead[0]["traceback"] and "in boom" in dead[0]["traceback"]


async def test_done_tasks_names_the_done_ones_of_those_asked_with_their_result_refs(tmp_path: Path) -> None:
    """``done_tasks`` answers which of the given ids are done tasks of the job, with the result
    ref each was completed with; dead, unknown and other jobs' ids are left out, and an
    unknown job is an error that names it."""

    async def run(task: LeasedTask) -> str:
        if task.seed == 1:
            raise ValueError("dies")
        return f"ref-{task.seed}"

    async with cluster(tmp_path) as c, workers(c, "n1", 2, run):
        await c.submit("d", 3, max_attempts=1)
        await c.submit("e", 1)
        await c.wait("d")
        await c.wait("e")
        asked = ["d-000000", "d-000001", "d-000002", "e-000000", "nope"]
        done = await c.call("done_tasks", {"job_id": "d", "task_ids": asked})
        with pytest.raises(TaskError, match="unknown job 'x'"):
            await c.call("done_tasks", {"job_id": "x", "task_ids": asked})
    assert done == {"d-000000": "ref-0", "d-000002": "ref-2"}


async def test_a_restarted_master_resumes_and_done_tasks_are_not_run_again(tmp_path: Path) -> None:
    """Stop the master mid-job, start another on its journal: workers re-register, nothing is lost."""
    ran: Counter[str] = Counter()
    gate = anyio.Event()

    async def run(task: LeasedTask) -> str:
        ran[task.task_id] += 1
        if task.seed >= 20:
            await gate.wait()
        return "out"

    hub = MemoryHub()
    path = tmp_path / "journal.db"
    journal, book = open_journal(path, new=True)
    first = Master(MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master"))
    c = Cluster(hub, tmp_path, first)
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.run)
        await first.ready.wait()
        async with Runtime("client", "client", hub.transport()) as client:
            c.runtimes["client"] = client
            async with workers(c, "n1", 3, run):
                await c.submit("m", 60)
                await until(lambda: sum(ran.values()) >= 23)
                first.stop()
                await until(lambda: first.runtime is not None and not hub.transports.get(MASTER))
                journal.close()
                with open_journal(path)[0] as peek:
                    done_before = {
                        t
                        for t in (f"m-{i:06d}" for i in range(60))
                        if str(peek.replay().task(t).state) == "done"
                    }
                journal, book = open_journal(path)
                second = Master(
                    MasterConfig(tick_s=0.01), journal, book, transport=hub.transport(name="master")
                )
                tg.start_soon(second.run)
                await second.ready.wait()
                gate.set()
                job = await c.wait("m")
                second.stop()
    journal.close()
    assert job["state"] == "done" and job["counts"]["done"] == 60
    assert len(done_before) >= 15
    assert all(ran[t] == 1 for t in done_before)
    assert sum(g.statistics().registrations for g in c.getters.values()) >= 6


async def test_requests_from_an_unknown_worker_are_refused(tmp_path: Path) -> None:
    """A worker the master does not know is told to register (unknown_worker)."""
    async with cluster(tmp_path) as c:
        with pytest.raises(UnknownWorker, match="register"):
            await c.call("request_task", {"worker_id": "ghost", "free_slots": 1})
        with pytest.raises(TaskError, match="no node 'nowhere'"):
            await c.call("drain", {"node": "nowhere"})
        with pytest.raises(TaskError, match="unknown job"):
            await c.call("wait_job", {"job_id": "nope"})


def test_a_missing_or_corrupt_journal_is_refused(tmp_path: Path) -> None:
    """No journal without --new, and never a corrupt one: a clear error, not an empty queue."""
    with pytest.raises(
        JournalError, match="does not exist; give the path of the existing journal, or pass --new"
    ):
        open_journal(tmp_path / "missing.db")
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    for new in (False, True):
        with pytest.raises(JournalError, match=r"not a database|not a \(healthy\) journal"):
            open_journal(bad, new)
    journal, book = open_journal(tmp_path / "fresh.db", new=True)
    journal.close()
    assert book.jobs() == []


@pytest.mark.parametrize("new", [False, True])
def test_a_journal_missing_with_its_folder_says_the_folder_first(tmp_path: Path, new: bool) -> None:
    """A disk not mounted: --new was advised, and failed too ("create it first"); the folder is
    said first, and --new is advised only where the folder is there."""
    path = tmp_path / "not-mounted" / "journal.db"
    with pytest.raises(JournalError) as refused:
        open_journal(path, new)
    said = str(refused.value)
    assert said.startswith(f"journal {path}: its folder {path.parent} does not exist: a disk not mounted?")
    assert "--new" not in said
    assert said.endswith(
        "create the folder first" if new else "mount it, or give the path of the existing journal"
    )
    assert not path.parent.exists()


def test_a_node_dead_for_an_hour_is_forgotten_and_new_again_if_it_beats() -> None:
    """A long-lived master whose hosts come and go lists a dead node for FORGET_DEAD_S, then
    forgets it (it listed every node it ever saw); one that beats after that is new again."""
    nodes = NodeTable(timeout_s=10.0)
    nodes.beat("gone", "tcp://a", {}, now=0.0)
    nodes.beat("stays", "tcp://b", {}, now=0.0)
    assert nodes.expired(10.1) == ["gone", "stays"]
    nodes.beat("stays", "tcp://b", {}, now=20.0)  # back: alive again, not forgotten
    assert [(n.node, n.alive) for n in nodes.nodes()] == [("gone", False), ("stays", True)]
    almost = 10.0 + FORGET_DEAD_S
    nodes.beat("stays", "tcp://b", {}, now=almost)
    assert nodes.expired(almost) == [] and [n.node for n in nodes.nodes()] == ["gone", "stays"]
    assert nodes.expired(almost + 0.1) == [] and [n.node for n in nodes.nodes()] == ["stays"]
    assert nodes.endpoint("gone") is None
    assert nodes.beat("gone", "tcp://c", {}, now=almost + 1.0) is True  # new again
    assert nodes.nodes()[0].endpoint == "tcp://c" and nodes.nodes()[0].revivals == 0


# ---------------------------------------------------------------- a held loop


def test_a_hold_moves_each_live_node_s_last_beat_on_never_past_now() -> None:
    nodes = NodeTable(timeout_s=10.0)
    nodes.beat("quiet", "tcp://a", {}, now=0.0)
    nodes.beat("fresh", "tcp://b", {}, now=11.5)  # its beat was read just after the hold
    nodes.forgive(12.0, now=12.0)  # "quiet" is moved on to 12.0; "fresh" too, not to 23.5
    assert nodes.expired(12.0) == []
    assert nodes.expired(21.9) == []  # silent 9.9 s of the time the master could hear
    assert nodes.expired(22.1) == ["quiet", "fresh"]  # silent 10.1 s: the hold is forgiven once
    assert nodes.expired(22.2) == []  # reported once


async def test_a_master_held_past_the_node_timeout_keeps_the_node_then_judges_it(tmp_path: Path) -> None:
    clock = FakeClock()
    async with cluster(tmp_path, node_timeout_s=10.0, clock=clock) as c:
        await c.call("node_beat", {"node": "n1", "endpoint": "mem://n1", "resources": {}})
        clock.advance(12.0)  # the loop held 12 s: the node's beats waited unread
        with structlog.testing.capture_logs() as logs:
            c.master.loop_held(12.0)
            await c.master.tick()
        assert [n["alive"] for n in (await c.call("status"))["nodes"]] == [True]
        assert [e["held_s"] for e in logs if e["event"] == "master_loop_held"] == [12.0]
        clock.advance(10.5)  # silent past the timeout while the master listened: dead
        await c.master.tick()
        assert [n["alive"] for n in (await c.call("status"))["nodes"]] == [False]


async def test_the_master_s_own_ticks_notice_a_held_loop(tmp_path: Path) -> None:
    """The tick that comes late after the loop was held (here by the test, blocking it) reports
    the hold: that is what forgives the nodes their unheard beats."""
    async with cluster(tmp_path):
        with structlog.testing.capture_logs() as logs:
            time.sleep(HELD_S + 0.1)  # noqa: ASYNC251 - the point: hold the loop, as a big submit did
            with anyio.fail_after(10):
                while not any(e["event"] == "master_loop_held" for e in logs):
                    await anyio.sleep(0.001)
        (held,) = [e["held_s"] for e in logs if e["event"] == "master_loop_held"]
        assert held >= HELD_S
