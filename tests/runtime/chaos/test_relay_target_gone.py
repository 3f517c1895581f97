"""``chaos`` against several workers takes its targets once, then relays to each in turn: a
worker that went meanwhile (a killed replica being reaped and restarted while an earlier relay
was awaited) is skipped and said so in the reply. It failed the whole ``chaos`` with a bare
``AssertionError``, and the workers after it were never armed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from troupe.runtime.chaos.relay import ChaosRelay
from troupe.runtime.node.config import ActorSpec, WorkerSpec
from troupe.runtime.node.worker_handles import WorkerHandle

ECHO = ActorSpec(name="echo", cls="troupe.actors.demo.actors:Echo")


def _running(name: str, endpoint: str) -> WorkerHandle:
    handle = WorkerHandle(WorkerSpec(name=name, actors=(ECHO,)))
    handle.launched(cast(Any, SimpleNamespace(pid=1000)))  # running once launched and registered
    handle.registered(endpoint, 1000, {"echo": endpoint})
    return handle


class _Runtime:
    """Answers every relay; the first one lets ``goes`` exit, as its reaping did meanwhile."""

    address = "tcp://127.0.0.1:25001"

    def __init__(self, goes: WorkerHandle) -> None:
        self.goes = goes
        self.relayed: list[str] = []

    async def control(self, endpoint: str, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
        self.relayed.append(endpoint)
        if self.goes.endpoint is not None:
            self.goes.exited(-9)  # its endpoint is cleared: the node restarts it
        return {"armed": 1}


class _Node:
    def __init__(self, workers: dict[str, WorkerHandle], runtime: _Runtime) -> None:
        self.name = "n1"
        self.workers = workers
        self.runtime = runtime


class _Supervision:
    pid = None

    def note_kill(self, pid: int | None, reason: str) -> None:
        raise AssertionError("no kill here")


@pytest.mark.parametrize("control", ["chaos", "heal"])
async def test_a_target_gone_since_the_targets_were_taken_is_skipped_and_said(control: str) -> None:
    first, gone, last = (_running(f"w{i}", f"tcp://127.0.0.1:2500{i}") for i in (2, 3, 4))
    runtime = _Runtime(goes=gone)
    relay = ChaosRelay(_Node({"w2": first, "w3": gone, "w4": last}, runtime), _Supervision())  # type: ignore[arg-type]
    if control == "chaos":
        reply = await relay.inject({"kind": "crash", "target": "*", "probability": 0.2, "seed": 1})
    else:
        reply = await relay.heal({"target": "*"})
    workers = reply["workers"]
    assert workers["w2"] == {"armed": 1} and workers["w4"] == {"armed": 1}  # the others still got it
    assert workers["w3"]["skipped"] is True
    assert "worker 'w3' is exited now, not running" in workers["w3"]["error"]
    assert runtime.relayed == ["tcp://127.0.0.1:25002", "tcp://127.0.0.1:25004"]
