"""Where a training run's actors listen, learnt from their nodes rather than the master.

A run on a master's cluster resolved its ranks' names through the master (the cluster's
directory) at every poll: with the master killed, every ``progress`` went unanswered while the
ranks trained on, the driver took a live rank for lost after two minutes, and failed the run on
the master's ``resolve`` as it restarted it. The node that spawns a worker answers with its
actors' endpoints (as the pipeline engine learns its replicas', ``pipeline/replicas.py``): they
are taught to the run's directory, so the run reaches its actors without the master; a worker
its node restarted listens elsewhere, and is resolved again at that node (it knows its workers
without the master).

Example::

    addresses = WorkerAddresses(rt)
    addresses.learn("w-train-rank-0", record)          # the node's answer to spawn_worker
    await rt.ref(addresses.of("train-rank-0")).ask("progress", None)
"""

from __future__ import annotations

from typing import Any

from troupe.runtime import TroupeError
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.library_logging import get_logger
from troupe.runtime.placement import Host

__all__ = ["WorkerAddresses"]

log = get_logger(__name__)

_RESOLVE_S = 5.0


class WorkerAddresses:
    """The full addresses (``node/worker/actor``) of a run's actors, taught to ``runtime``'s
    directory; an actor not learnt is named as it is (resolved through the runtime's directory)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._full: dict[str, str] = {}

    def of(self, actor: str) -> str:
        """The address to reach ``actor`` at: its full one where its node said, else its name."""
        return self._full.get(actor, actor)

    def learn(self, worker: str, record: Any) -> None:
        """Learn the actors of ``worker`` from its node's answer to ``spawn_worker`` (``node``
        and ``actor_endpoints``; a node that gives neither teaches nothing)."""
        node = record.get("node") if isinstance(record, dict) else None
        endpoints = record.get("actor_endpoints") if isinstance(record, dict) else None
        if not isinstance(node, str) or not node or not isinstance(endpoints, dict):
            return
        for actor, endpoint in endpoints.items():
            if isinstance(actor, str) and isinstance(endpoint, str):
                self._teach(actor, f"{node}/{worker}/{actor}", endpoint)

    async def resolve_at_node(self, actor: str, worker: str, host: Host) -> None:
        """Ask ``host``'s node where ``actor`` of ``worker`` listens now (its node restarted
        it), and learn it. Where the node cannot say (the worker not started again yet), the
        endpoint known is forgotten all the same: the next ask resolves the name through the
        runtime's directory (the master), not at a process that is gone."""
        known = self._full.get(actor)
        if known is not None:
            self.runtime.directory.forget(known)
        try:
            reply = await self.runtime.control(
                host.endpoint, "resolve", {"address": f"{worker}/{actor}"}, timeout=_RESOLVE_S
            )
        except TroupeError as exc:
            log.info("train_resolve_at_node_failed", actor=actor, node=host.name, error=str(exc))
            return
        address = reply.get("address") if isinstance(reply, dict) else None
        endpoint = reply.get("endpoint") if isinstance(reply, dict) else None
        if isinstance(address, str) and isinstance(endpoint, str):
            self._teach(actor, address, endpoint)

    def _teach(self, actor: str, address: str, endpoint: str) -> None:
        self.runtime.directory.learn(address, endpoint)
        self._full[actor] = address
