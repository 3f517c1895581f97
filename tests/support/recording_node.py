"""A fake node, as a pipeline engine's runtime, that records what the run asks of it: it starts
replicas at once (each answering every item ok), and its stops and pings are recorded and
answered as a subclass says (at once by default; never, for a node that died: ``DeadNode``)."""

from __future__ import annotations

from typing import Any

import anyio

from support.ok_replica import OkReplica
from troupe.runtime.errors import AskTimeout
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.hosts import EngineHosts
from troupe.runtime.pipeline.source import LocalSource

__all__ = ["NODE", "DeadNode", "RecordingNode", "one_stage_engine"]

NODE = "tcp://127.0.0.1:1"  # a node the run can reach: its replicas name the run their owner


class RecordingNode:
    """The runtime of a run whose node records every spawn, stop and ping."""

    address = "tcp://127.0.0.1:9"  # the run's own endpoint

    def __init__(self) -> None:
        self.spawns: list[dict[str, Any]] = []
        self.stops: list[dict[str, Any]] = []
        self.stopped: list[str] = []
        self.pings: list[float | None] = []
        self.stop_asked = anyio.Event()

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "spawn_worker":
            self.spawns.append(dict(payload))
        elif kind == "stop_worker":
            self.stops.append(dict(payload))
            self.stop_asked.set()
            await self.stop(payload, timeout)
            self.stopped.append(payload["name"])
        elif kind == "ping":
            self.pings.append(timeout)
            await self.ping(timeout)
        elif kind == "supervision":
            running = [s["name"] for s in self.spawns if s["name"] not in self.stopped]
            return {"workers": [{"name": n, "state": "running"} for n in running]}
        return {}

    async def stop(self, payload: dict[str, Any], timeout: float | None) -> None:
        """The node's stop: done at once."""

    async def ping(self, timeout: float | None) -> None:
        """The node's answer to a ping: at once."""

    def ref(self, path: str) -> Any:
        return OkReplica()


class DeadNode(RecordingNode):
    """A node that died: a stop is never answered (the runtime gives it up at its deadline),
    and a ping is not answered either, unless ``answers_pings`` (the master decides then)."""

    def __init__(self, answers_pings: bool = False) -> None:
        super().__init__()
        self.answers_pings = answers_pings
        self.abandoned: list[str] = []  # stops cancelled before their deadline
        self.timed_out: list[str] = []  # stops waited for to their deadline

    async def stop(self, payload: dict[str, Any], timeout: float | None) -> None:
        assert timeout is not None
        try:
            await anyio.sleep(timeout)
        except anyio.get_cancelled_exc_class():
            self.abandoned.append(payload["name"])
            raise
        self.timed_out.append(payload["name"])
        raise AskTimeout(f"ask 'stop_worker' to {NODE}: no reply within {timeout:g} s")

    async def ping(self, timeout: float | None) -> None:
        if not self.answers_pings:  # as the runtime says once the ping's deadline passed
            raise AskTimeout(f"ask 'ping' to {NODE}: no reply within {timeout} s")


def one_stage_engine(node: RecordingNode, hosts: EngineHosts | None = None) -> PipelineEngine:
    """A run of 4 items through one stage (one replica, no hooks) on ``node``."""
    cfg = PipelineConfig.model_validate(
        {"name": "p", "items": 4, "scale_interval_s": 3600.0, "stages": [{"name": "a", "actor": "m:Stage"}]}
    )
    source = LocalSource(cfg.name, cfg.items)
    return PipelineEngine(cfg, node, NODE, source=source, hosts=hosts)  # type: ignore[arg-type]
