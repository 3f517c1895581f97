"""Where a training run's workers run: the runtime and hosts of a master's cluster, or of a
one-host cluster started in this process (a node on a free loopback port, which carries every
tag); and stopping the workers spawned there.

A stop is the pipeline's (``runtime/worker_stop.py``): it names the run's process, so that one
reaching a node late (a run stopped, a rerun started) cannot stop the rerun's rank of the same
name, and it is given up once the node does not answer a ping (it died, taking the worker with
it), rather than waited for to its deadline."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from troupe.runtime import TroupeError
from troupe.runtime.core.client import connect
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.library_logging import get_logger
from troupe.runtime.node.config import KindSupervision, NodeConfig, SupervisionConfig
from troupe.runtime.node.local import start_local_node
from troupe.runtime.owned_controls import OwnedControls
from troupe.runtime.placement import Host, cluster_hosts, cluster_status
from troupe.runtime.transports.loopback import free_endpoint
from troupe.runtime.worker_stop import stop_on_node

__all__ = ["TRAINING_KINDS", "check_master", "local_gpus", "stop_remote", "stop_worker", "training_cluster"]

log = get_logger(__name__)

TRAINING_KINDS = {
    # A train step may keep the trainer's loop busy for long: no progress bound, a long beat grace.
    "trainer": KindSupervision(progress_timeout_s=0.0, heartbeat_timeout_s=30.0),
    "encoder": KindSupervision(progress_timeout_s=300.0, heartbeat_timeout_s=30.0),
}
"""The local node's supervision of the training kinds (a cluster's nodes should set the same)."""


Keys = str | os.PathLike[str] | None
"""A cluster's CURVE keys directory (None: ``$TROUPE_KEYS`` where set, as ``connect`` takes it)."""


async def check_master(master: str, keys: Keys = None) -> None:
    """Ask the master at ``master`` for its status with ``keys``, before the run makes anything
    in its folder: a keyless run against a keyed master is told so at once (the transport's
    words), where it had recorded ``--out`` and then said that no master answered.

    Raises:
        Unreachable: the master did not answer, or refused this process's keys (or lack of them).
        ConfigError: the keys cannot be loaded; what answered is no master.
    """
    async with connect(master, keys=keys) as rt:
        await cluster_status(rt, master)


@asynccontextmanager
async def training_cluster(
    master: str | None,
    node_endpoint: str | None,
    out: Path,
    endpoint_may_move: bool = False,
    keys: Keys = None,
) -> AsyncIterator[tuple[Runtime, list[Host]]]:
    """A runtime and the hosts to place workers on; a node started here is stopped on the way out.

    ``out``: the run's folder; a node started here logs to its ``logs`` and names it in its
    ``status`` (``out``, as a pipeline run's node does: whose run it is, for ``ctl status``).
    ``endpoint_may_move``: ``node_endpoint`` is a default found free a moment ago; taken since,
    the node listens on a free port of its host instead (the local host's endpoint says which).
    ``keys``: the master's cluster's (with ``master`` only)."""
    if master is not None:
        async with connect(master, keys=keys) as rt:
            yield rt, await cluster_hosts(rt, master)
        return
    async with anyio.create_task_group() as tg:
        node_cfg = NodeConfig(
            name="local",
            endpoint=node_endpoint or free_endpoint(),
            log_dir=out / "logs",
            stop_grace_s=10,
            supervision=SupervisionConfig(kinds=TRAINING_KINDS),
        )
        node = await start_local_node(tg, node_cfg, endpoint_may_move=endpoint_may_move)
        endpoint = node.config.endpoint  # another, if it had to move
        out_shown = str(out)
        node.status_extras["out"] = lambda: out_shown
        try:
            async with connect(endpoint, "local", env_keys=False) as rt:  # keyless, as started here
                yield rt, [Host.anything("local", endpoint, local_gpus())]
        finally:
            with anyio.CancelScope(shield=True):
                node.stopping.set()
                with anyio.move_on_after(node_cfg.stop_grace_s + 30):
                    await node.stopped.wait()


def local_gpus() -> int:
    """The GPUs torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


async def stop_worker(controls: OwnedControls, worker: str, host: Host) -> bool:
    """Stop this run's ``worker`` through its node (see the module; a node gone or a worker gone
    already is no error). The run keeps no live list of the master's nodes: the ping decides.

    Returns:
        Whether the node answered that it stopped the worker (not: it had none of the run's by
        that name, or it was given up)."""
    try:
        given_up = await stop_on_node(controls, worker, host)
    except (TroupeError, OSError) as exc:
        log.info("train_worker_stop_failed", worker=worker, node=host.name, error=str(exc))
        return False
    if given_up is not None:  # dead, or dying: it takes its workers with it
        log.warning("train_worker_stop_given_up", worker=worker, node=host.name, why=given_up)
        return False
    return True


async def stop_remote(master: str, spawned: list[tuple[str, Host]], keys: Keys = None) -> None:
    """Stop the workers spawned on the cluster's nodes, in parallel, each within its node's stop
    grace; through a runtime of its own (with the run's ``keys``), as the run's may be cancelled
    (Ctrl-C) by now."""
    async with connect(master, keys=keys) as rt, anyio.create_task_group() as tg:
        controls = OwnedControls(rt)  # the same process as the spawns': the nodes heed its stops
        for worker, host in list(spawned):
            tg.start_soon(stop_worker, controls, worker, host)
