"""Where a training run's workers run: the runtime and hosts of a master's cluster, or of a
one-host cluster started in this process (a node on a free loopback port, which carries every
tag); and stopping the workers spawned there."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from troupe.runtime import TroupeError
from troupe.runtime.core.client import connect
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.node.config import KindSupervision, NodeConfig, SupervisionConfig
from troupe.runtime.node.local import start_local_node
from troupe.runtime.placement import Host, cluster_hosts
from troupe.runtime.transports.loopback import free_endpoint

__all__ = ["TRAINING_KINDS", "local_gpus", "stop_remote", "stop_worker", "training_cluster"]

TRAINING_KINDS = {
    # A train step may keep the trainer's loop busy for long: no progress bound, a long beat grace.
    "trainer": KindSupervision(progress_timeout_s=0.0, heartbeat_timeout_s=30.0),
    "encoder": KindSupervision(progress_timeout_s=300.0, heartbeat_timeout_s=30.0),
}
"""The local node's supervision of the training kinds (a cluster's nodes should set the same)."""


@asynccontextmanager
async def training_cluster(
    master: str | None, node_endpoint: str | None, log_dir: Path
) -> AsyncIterator[tuple[Runtime, list[Host]]]:
    """A runtime and the hosts to place workers on; a node started here is stopped on the way out."""
    if master is not None:
        async with connect(master) as rt:
            yield rt, await cluster_hosts(rt, master)
        return
    async with anyio.create_task_group() as tg:
        node_cfg = NodeConfig(
            name="local",
            endpoint=node_endpoint or free_endpoint(),
            log_dir=log_dir,
            stop_grace_s=10,
            supervision=SupervisionConfig(kinds=TRAINING_KINDS),
        )
        node = await start_local_node(tg, node_cfg)
        try:
            async with connect(node_cfg.endpoint, "local") as rt:
                yield rt, [Host.anything("local", node_cfg.endpoint, local_gpus())]
        finally:
            with anyio.CancelScope(shield=True):
                node.stopping.set()
                with anyio.move_on_after(node_cfg.stop_grace_s + 30):
                    await node.stopped.wait()


def local_gpus() -> int:
    """The GPUs torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


async def stop_worker(rt: Runtime, worker: str, host: Host) -> None:
    """Stop ``worker`` through its node (a node gone or a worker gone already is no error)."""
    with contextlib.suppress(TroupeError, OSError):
        await rt.control(host.endpoint, "stop_worker", {"name": worker}, timeout=60)


async def stop_remote(master: str, spawned: list[tuple[str, Host]]) -> None:
    """Stop the workers spawned on the cluster's nodes, in parallel, each within its node's stop
    grace; through a runtime of its own, as the run's may be cancelled (Ctrl-C) by now."""
    async with connect(master) as rt, anyio.create_task_group() as tg:
        for worker, host in list(spawned):
            tg.start_soon(stop_worker, rt, worker, host)
