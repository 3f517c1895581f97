"""A fault that could never fire is refused, and a kill never claims a process already killed.

``--message-type`` that no actor of the target handles was armed silently and never fired, so
a test that relied on it passed with no fault injected; the worker now refuses it, naming what
its actors handle, and the node refuses the ``chaos`` when every target did. A second ``kill
'*'`` reported killing the same pids as the first (dead, not yet reaped): they are skipped now.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from troupe.actors.demo.actors import Echo
from troupe.runtime.chaos.relay import ChaosRelay
from troupe.runtime.chaos.worker_side import WorkerChaos
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import ActorSpec, WorkerSpec
from troupe.runtime.node.worker_handles import WorkerHandle
from troupe.runtime.tasks.task_actor import LeasedTask, TaskActor
from troupe.runtime.transports.base import MemoryHub

ECHO = ActorSpec(name="echo", cls="troupe.actors.demo.actors:Echo")


class Render(TaskActor):
    task_kinds = ("render",)

    async def run_task(self, task: LeasedTask) -> str:
        return "out://x"


async def test_a_worker_refuses_a_fault_on_a_message_type_none_of_its_actors_handles() -> None:
    async with Runtime("n", "w-count", MemoryHub().transport()) as rt:
        await rt.spawn(Echo, "echo")
        await rt.spawn(Render, "render")
        chaos = WorkerChaos(rt)
        with pytest.raises(ConfigError) as caught:
            await chaos._chaos({"faults": [{"kind": "slow", "seconds": 1, "message_type": "nosuch"}]})
        said = str(caught.value)
        assert "chaos slow: no actor of worker 'w-count' handles message type 'nosuch'" in said, said
        assert "echo: echo, fail, pid, sleep, sum; render: task kinds render" in said, said
        assert chaos.armed() == []  # nothing armed
        with pytest.raises(ConfigError, match="message type 'render'"):  # scoped to an actor
            await chaos._chaos({"faults": [{"kind": "crash", "actor": "echo", "message_type": "render"}]})
        # a handler's message type, or a task kind a task actor runs: armed
        await chaos._chaos({"faults": [{"kind": "crash", "actor": "echo", "message_type": "echo"}]})
        await chaos._chaos({"faults": [{"kind": "crash", "message_type": "render"}]})
        assert chaos.armed() == ["crash"]


def _running(name: str, endpoint: str, pid: int) -> WorkerHandle:
    handle = WorkerHandle(WorkerSpec(name=name, actors=(ECHO,)))
    process = SimpleNamespace(pid=pid, signals=[], send_signal=lambda sig: process.signals.append(sig))
    handle.launched(cast(Any, process))
    handle.registered(endpoint, pid, {"echo": endpoint})
    return handle


class _Runtime:
    """Relays to the workers: those in ``refusing`` refuse the spec, as a worker does."""

    address = "tcp://127.0.0.1:26501"

    def __init__(self, refusing: set[str]) -> None:
        self.refusing = refusing

    async def control(self, endpoint: str, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
        if endpoint in self.refusing:
            raise ConfigError(f"chaos slow: no actor of worker at {endpoint} handles message type 'nosuch'")
        return {"armed": 1}


class _Node:
    def __init__(self, workers: dict[str, WorkerHandle], runtime: _Runtime) -> None:
        self.name = "n1"
        self.workers = workers
        self.runtime = runtime


class _Supervision:
    pid = None

    def __init__(self) -> None:
        self.noted: list[int | None] = []

    def note_kill(self, pid: int | None, reason: str) -> None:
        self.noted.append(pid)


A, B = "tcp://127.0.0.1:26502", "tcp://127.0.0.1:26503"


async def test_the_node_refuses_a_fault_every_target_refused_and_says_which_skipped_it() -> None:
    workers = {"w-a": _running("w-a", A, 101), "w-b": _running("w-b", B, 102)}
    relay = ChaosRelay(_Node(workers, _Runtime({A, B})), _Supervision())  # type: ignore[arg-type]
    fault = {"kind": "slow", "seconds": 1.0, "message_type": "nosuch"}
    with pytest.raises(ConfigError, match="handles message type 'nosuch'"):
        await relay.inject({**fault, "target": "w-a"})
    with pytest.raises(ConfigError, match="handles message type 'nosuch'"):
        await relay.inject({**fault, "target": "*"})
    relay = ChaosRelay(_Node(workers, _Runtime({A})), _Supervision())  # type: ignore[arg-type]
    reply = await relay.inject({**fault, "target": "*"})  # armed where it can fire
    assert reply["workers"]["w-b"] == {"armed": 1}
    assert reply["workers"]["w-a"]["skipped"] is True and "nosuch" in reply["workers"]["w-a"]["error"]


def test_a_second_kill_skips_the_processes_the_first_killed_and_not_yet_reaped() -> None:
    workers = {"w-a": _running("w-a", A, 101), "w-b": _running("w-b", B, 102)}
    supervision = _Supervision()
    relay = ChaosRelay(_Node(workers, _Runtime(set())), supervision)  # type: ignore[arg-type]
    assert relay._kill("*") == {"kind": "kill", "killed": {"w-a": 101, "w-b": 102}}
    again = relay._kill("*")  # their returncode unset: the node has not reaped them yet
    assert again["killed"] == {}
    assert again["skipped"] == {
        "w-a": "pid 101 was killed already and is not restarted yet",
        "w-b": "pid 102 was killed already and is not restarted yet",
    }
    assert supervision.noted == [101, 102]  # each SIGKILLed once
    assert [len(cast(Any, h.process).signals) for h in workers.values()] == [1, 1]
    workers["w-a"].exited(-9)  # reaped, then restarted: the new process is killed
    workers["w-a"].launched(cast(Any, SimpleNamespace(pid=103, send_signal=lambda sig: None)))
    assert relay._kill("w-a") == {"kind": "kill", "killed": {"w-a": 103}}
