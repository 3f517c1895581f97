"""Where a training run's workers start again when their node is gone.

A rank's node that died (killed, its host lost) took the rank with it; the run restarted every
rank on the hosts it had placed them on at its start, and the spawn on the dead node waited out
its whole deadline (two minutes), then failed the run, however many restarts it had left. Each
restart now asks the master which nodes live, pings the nodes of its workers (the master lists a
node for its ``node_timeout`` after it died), and places the workers of a node that is gone on
the live nodes that fit them, as at the start (:func:`~troupe.runtime.placement.place`: their
tags and GPUs; no node fits: the run fails saying what the cluster offers).
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from troupe.runtime import TroupeError
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.library_logging import get_logger
from troupe.runtime.placement import Host, cluster_hosts, place
from troupe.runtime.worker_stop import node_silent

__all__ = ["live_hosts", "moves", "silent_nodes"]

log = get_logger(__name__)


async def live_hosts(runtime: Runtime, master: str, placed: Sequence[Host]) -> list[Host] | None:
    """The master's live nodes, less those of ``placed`` that do not answer a ping; None where
    the master does not answer (the workers stay where they were)."""
    try:
        listed = await cluster_hosts(runtime, master)
    except TroupeError as exc:
        log.warning("train_live_nodes_unknown", master=master, error=str(exc))
        return None
    names = {h.name for h in listed}
    silent = await silent_nodes(runtime, [h for h in placed if h.name in names])
    for node, why in silent.items():
        log.warning("train_node_gone", node=node, why=why)
    return [h for h in listed if h.name not in silent]


async def silent_nodes(runtime: Runtime, hosts: Sequence[Host]) -> dict[str, str]:
    """The nodes of ``hosts`` that do not answer a ping (each pinged once, all at once): why,
    by node name."""
    silent: dict[str, str] = {}
    async with anyio.create_task_group() as tg:

        async def probe(host: Host) -> None:
            why = await node_silent(runtime, host)
            if why is not None:
                silent[host.name] = why

        for host in {h.name: h for h in hosts}.values():
            tg.start_soon(probe, host)
    return silent


def moves(
    placed: Sequence[Host], live: Sequence[Host], tags: Sequence[str], gpus: int, what: str
) -> dict[int, Host]:
    """For each of ``placed`` whose node is not among ``live``, by its index: the live host it
    moves to (round-robin over those that fit, as ``place``).

    Raises:
        ConfigError: no live node fits them (names what the cluster offers).
    """
    names = {h.name for h in live}
    lost = [i for i, host in enumerate(placed) if host.name not in names]
    if not lost:
        return {}
    return dict(zip(lost, place(len(lost), live, tags, gpus, what=what), strict=True))
