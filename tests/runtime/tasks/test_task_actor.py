"""Task actors in a worker process, leases off the wire, node liveness and GPU counting."""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from troupe.actors.demo.tasks import SleepTask
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import BadFrame, TaskError
from troupe.runtime.node import master_link as node_agent
from troupe.runtime.tasks.content_store import ContentStore
from troupe.runtime.tasks.getter_start import start_task_getter
from troupe.runtime.tasks.master.nodes import NodeTable
from troupe.runtime.tasks.output_store import OutputStore
from troupe.runtime.tasks.task_actor import RESULT_REF_MOST_BYTES, LeasedTask, TaskActor
from troupe.runtime.tasks.task_runner import ActorRunner
from troupe.runtime.transports.base import MemoryHub

WIRE = {
    "task_id": "t-1",
    "lease_id": 7,
    "job_id": "j",
    "kind": "sleep",
    "seed": 3,
    "refs": {"params": "cas://x"},
    "attempt": 2,
    "backup": True,
    "ttl": 9.5,
}


class Render(TaskActor):
    task_kinds = ("render",)
    slots = 2
    gpus = 1

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def run_task(self, task: LeasedTask) -> str | None:
        self.seen[task.task_id] += 1
        return f"out/{task.task_id}"


def test_a_lease_is_read_off_the_wire_and_checked() -> None:
    """A lease map becomes a LeasedTask; a malformed one raises BadFrame naming the problem."""
    task = LeasedTask.from_wire(WIRE)
    assert (task.task_id, task.lease_id, task.attempt, task.backup, task.ttl) == ("t-1", 7, 2, True, 9.5)
    assert task.refs == {"params": "cas://x"}
    for bad in ({**WIRE, "seed": "x"}, {k: v for k, v in WIRE.items() if k != "lease_id"}, [1, 2]):
        with pytest.raises(BadFrame, match="malformed lease"):
            LeasedTask.from_wire(bad)


async def test_the_worker_getter_offers_its_task_actors_slots_and_gpus() -> None:
    """start_task_getter sums the hosted task actors' slots and GPUs, and skips plain workers."""
    hub = MemoryHub()
    async with Runtime("n", "w", hub.transport()) as rt:
        assert start_task_getter(rt, "mem://master", "n", "w") is None
        await rt.spawn(Render, "r1")
        await rt.spawn(Render, "r2")
        getter = start_task_getter(rt, "mem://master", "n", "w")
        assert getter is not None
        cfg = getter.config
        assert (cfg.worker_id, cfg.node_id, cfg.slots, cfg.gpu, cfg.kinds) == ("n/w", "n", 4, 2, ("render",))
        assert "cancel_lease" in rt.control_handlers


async def test_a_kind_no_hosted_actor_runs_fails_the_attempt_clearly() -> None:
    """A lease of a kind the worker's actors do not run fails with an error naming the kinds."""
    runner = ActorRunner([Render()])
    assert await runner(LeasedTask("a", "j", "render", 1)) == "out/a"
    with pytest.raises(TaskError, match=r"runs task kind 'encode'.*'render'"):
        await runner(LeasedTask("b", "j", "encode", 1))


async def test_sleep_task_commits_once_and_reads_its_params_lazily(tmp_path: Path) -> None:
    """The demo task loads its context from the content store and commits its output once."""
    content = ContentStore(tmp_path / "cas", durable=False)
    ref = content.put(json.dumps({"min_ms": 1, "max_ms": 2}).encode())
    hub = MemoryHub()
    async with Runtime("n", "w", hub.transport()) as rt:
        await rt.spawn(
            SleepTask,
            "t",
            kwargs={"outputs": str(tmp_path / "out"), "content": str(tmp_path / "cas"), "durable": False},
        )
        actor: Any = rt.cells["t"].actor
        task = LeasedTask("t-1", "j", "sleep", 5, {"params": ref}, lease_id=1)
        assert await actor.run_task(task) == "out://t-1"
        assert await actor.run_task(task) == "out://t-1"  # a second copy: no second commit
        with pytest.raises(ValueError, match="fails on purpose"):
            await actor.run_task(LeasedTask("t-2", "j", "fail", 1))
    store = OutputStore(tmp_path / "out")
    assert store.committed() == ["t-1"]
    result = json.loads((store.committed_path("t-1") / "result.json").read_text())
    assert (result["node"], result["worker"], result["ms"]) == ("n", "w", 2)
    lines = [ln for f in (tmp_path / "out" / "commit-log").iterdir() for ln in f.read_text().splitlines()]
    assert lines == ["t-1 n w"]


async def test_a_restarted_sleep_task_appends_to_its_workers_one_commit_log(tmp_path: Path) -> None:
    """A file per process grew the commit log by one file per kill under chaos, for good."""
    hub = MemoryHub()
    for incarnation in range(3):  # the worker restarted twice: same node and worker name
        async with Runtime("n", "w", hub.transport()) as rt:
            await rt.spawn(SleepTask, "t", kwargs={"outputs": str(tmp_path / "out"), "durable": False})
            actor: Any = rt.cells["t"].actor
            await actor.run_task(LeasedTask(f"t-{incarnation}", "j", "sleep", 1, lease_id=1))
    (log,) = (tmp_path / "out" / "commit-log").iterdir()
    assert log.name == "n-w.log" and log.read_text().splitlines() == ["t-0 n w", "t-1 n w", "t-2 n w"]


def test_node_table_declares_a_silent_node_dead_once() -> None:
    """A node is alive from its first beat, dead once silent past the timeout, alive if it beats again."""
    table = NodeTable(timeout_s=3.0)
    assert table.beat("a", "tcp://a", {"cpus": 4}, now=10.0) is True
    assert table.beat("a", "tcp://a", {}, now=11.0) is False
    assert table.expired(now=13.9) == []
    assert table.expired(now=14.1) == ["a"]
    assert table.expired(now=20.0) == []
    assert table.beat("a", "", {}, now=21.0) is True
    (info,) = table.nodes()
    assert (info.alive, info.endpoint, info.resources) == (True, "tcp://a", {"cpus": 4})


@pytest.mark.parametrize(("visible", "count"), [("0,1,3", 3), ("", 0), ("-1", 0), ("GPU-abc", 1)])
def test_gpus_are_counted_from_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: str, count: int
) -> None:
    """CUDA_VISIBLE_DEVICES decides how many GPUs a node reports, without importing torch."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(node_agent, "_GPU_COUNT", None)
    assert node_agent.count_gpus() == count
    resources = node_agent.host_resources()
    assert resources["gpus"] == count and resources["cpus"] >= 1


async def test_a_sleeping_demo_task_can_be_cancelled(tmp_path: Path) -> None:
    """Cancelling a running copy leaves nothing committed (the output is written aside first)."""
    actor = SleepTask(str(tmp_path), slowdown=100.0, durable=False)
    hub = MemoryHub()
    async with Runtime("n", "w", hub.transport()) as rt:
        await rt.spawn(actor, "t")
        with anyio.move_on_after(0.01):
            await actor.run_task(LeasedTask("slow", "j", "sleep", 0, {}))
    assert OutputStore(tmp_path).committed() == []


class ReturnsNoReference(TaskActor):
    """Returns what a result reference cannot be: the master's journal takes a str or nothing."""

    def __init__(self, result: Any) -> None:
        self.result = result

    async def run_task(self, task: LeasedTask) -> Any:
        return self.result


@pytest.mark.parametrize("result", [42, lambda: 1, b"out://x"])
async def test_a_run_task_that_returns_no_str_fails_the_attempt_naming_the_class(result: Any) -> None:
    """Before, the getter reported it as complete, the master refused that, and the task stayed
    leased until its lease expired; the attempt fails at once now, saying what to return."""
    runner = ActorRunner([ReturnsNoReference(result)])
    expected = r"ReturnsNoReference\.run_task returned .* must return a str .* or None"
    with pytest.raises(TypeError, match=expected):
        await runner(LeasedTask("a", "j", "k", 1))
    for fine in ("out://a", None):
        assert await ActorRunner([ReturnsNoReference(fine)])(LeasedTask("a", "j", "k", 1)) == fine


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (
            "a\udc80b",
            r"returned a str that is not valid UTF-8 \(surrogates not allowed: '\\udc80' at index 1 ",
        ),
        (
            "x" * 70 * 2**20,
            r"returned a str of 73,400,320 characters: .* at most 4096 bytes of UTF-8; commit ",
        ),
        ("\u00e9" * 2049, r"returned a str of 4,098 bytes: a task's result is a short reference"),
    ],
    ids=["surrogate", "70 MiB", "4098 bytes"],
)
async def test_a_run_task_that_returns_a_str_no_report_can_carry_fails_the_attempt_saying_so(
    result: str, expected: str
) -> None:
    """px 7: the worker's own codec refused the report (a lone surrogate; 70 MiB, over the
    message bound), and the dead letter said "the master refused this attempt's complete
    report", with advice to raise max_message_mb; the attempt fails in run_task's words now."""
    with pytest.raises(ValueError, match=r"^ReturnsNoReference\.run_task " + expected):
        await ActorRunner([ReturnsNoReference(result)])(LeasedTask("a", "j", "k", 1))
    for fine in ("x" * RESULT_REF_MOST_BYTES, "\u00e9" * (RESULT_REF_MOST_BYTES // 2), "a\x00b"):
        assert await ActorRunner([ReturnsNoReference(fine)])(LeasedTask("a", "j", "k", 1)) == fine


def test_a_plain_def_run_task_is_refused_as_the_class_is_made() -> None:
    """Before, every task of it was dead-lettered with "object str can't be used in 'await'
    expression"; the class itself is refused now, so the node's class check says so at once."""
    with pytest.raises(TypeError, match=r"^Plain\.run_task must be `async def`"):

        class Plain(TaskActor):
            def run_task(self, task: LeasedTask) -> str:  # type: ignore[override]
                return "out://x"

    def wraps(method: Any) -> Any:
        @functools.wraps(method)
        def wrapper(*args: Any) -> Any:
            return method(*args)

        return wrapper

    class Decorated(TaskActor):  # a decorated async def is still one
        @wraps
        async def run_task(self, task: LeasedTask) -> str:
            return "out://x"


async def test_a_run_task_that_returns_no_coroutine_fails_the_attempt_saying_so() -> None:
    """A plain run_task set past the class check (here, after the class was made) fails the
    attempt naming the class, not with "object str can't be used in 'await' expression"."""

    class Patched(TaskActor):
        async def run_task(self, task: LeasedTask) -> str:
            return "out://x"

    Patched.run_task = lambda self, task: "out://x"  # type: ignore[assignment,method-assign,misc]
    with pytest.raises(TypeError, match=r"Patched\.run_task must be `async def`: it returned 'out://x'"):
        await ActorRunner([Patched()])(LeasedTask("a", "j", "k", 1))
