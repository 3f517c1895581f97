"""A two-stage pipeline whose last stage waits at a gate (a file), for tests that stop a cluster
run while it holds items; and the replicas of a run still running on the master's nodes."""

from __future__ import annotations

from pathlib import Path

from troupe.runtime.core.client import connect
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.hosts import wait_for_nodes

__all__ = ["gated_config", "running_replicas"]

STAGES = "support.direct_plane_stages"


def gated_config(name: str, items: int, log: Path, gate: Path) -> PipelineConfig:
    """``make`` then ``check``; each item records itself in ``log`` and waits at ``gate`` in check."""
    kwargs = {"nbytes": 1024, "log": str(log)}
    return PipelineConfig.model_validate(
        {
            "name": name,
            "items": items,
            "scale_interval_s": 0.1,
            "stages": [
                {"name": "make", "actor": f"{STAGES}:MakePayload", "kwargs": kwargs},
                {"name": "check", "actor": f"{STAGES}:CheckPayload", "kwargs": {**kwargs, "gate": str(gate)}},
            ],
        }
    )


async def running_replicas(master: str, pipeline: str, nodes: int) -> list[str]:
    """The names of the pipeline's replicas still running (or starting) on the master's ``nodes``
    live nodes."""
    async with connect(master) as rt:
        names = []
        for host in await wait_for_nodes(rt, master, nodes, timeout_s=30):
            reply = await rt.control(host.endpoint, "supervision", None, timeout=30)
            names += [
                str(w["name"])
                for w in reply["workers"]
                if str(w.get("name", "")).startswith(f"{pipeline}-")
                and w.get("state") in ("running", "starting")
            ]
        return names
