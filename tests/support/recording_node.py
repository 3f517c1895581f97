"""A fake node, as a pipeline engine's runtime, that records what the run asks of it: it starts
replicas at once (each answering every item ok), and its stops and pings are recorded and
answered as a subclass says (at once by default)."""

from __future__ import annotations

from typing import Any

import anyio

from support.ok_replica import OkReplica
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.hosts import EngineHosts
from troupe.runtime.pipeline.source import LocalSource

__all__ = ["NODE", "RecordingNode", "one_stage_engine"]

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


def one_stage_engine(node: RecordingNode, hosts: EngineHosts | None = None) -> PipelineEngine:
    """A run of 4 items through one stage (one replica, no hooks) on ``node``."""
    cfg = PipelineConfig.model_validate(
        {"name": "p", "items": 4, "scale_interval_s": 3600.0, "stages": [{"name": "a", "actor": "m:Stage"}]}
    )
    source = LocalSource(cfg.name, cfg.items)
    return PipelineEngine(cfg, node, NODE, source=source, hosts=hosts)  # type: ignore[arg-type]
