"""Workers spawned for a requester that is gone are stopped: a ``troupe run`` killed with
SIGKILL (or whose host died) cannot stop the replicas it started on a cluster's nodes, which
ran on for ever, and a rerun of the same pipeline could not start replicas of the same names.

A ``spawn_worker`` request may name its ``owner``: the endpoint of the requester's runtime. The
node pings each owner of its running spawned workers every ``interval_s``; one that does not
answer ``misses`` times in a row (``AskTimeout``, ``Unreachable``) is gone, and the node stops
its workers as ``stop_worker`` would (their records stay, stopped). An answer of any kind, an
error reply included, is an owner that is there. A worker spawned without an owner (an
operator's ``troupe ctl``) is never stopped this way. A request for the name of a running worker
whose owner (another one) does not answer now replaces it at once (``gone``): the rerun of a
killed run need not wait for the watch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import structlog

from troupe.runtime.core.client import answers
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import TroupeError

from .worker_handles import WorkerHandle

__all__ = ["OwnerWatch"]

log = structlog.get_logger(__name__)

PING_TIMEOUT_S = 5.0  # a run's process on a loaded machine may answer late: not gone


class OwnerWatch:
    """Stops the spawned workers whose owner stopped answering.

    Args:
        runtime: the node's runtime (it pings the owners).
        workers: the node's worker records, by name.
        stop: stops a worker by name, as the node's ``stop_worker`` control does.
        interval_s: how often the owners are pinged.
        misses: pings in a row an owner may miss before its workers are stopped.
    """

    def __init__(
        self,
        runtime: Runtime,
        workers: dict[str, WorkerHandle],
        stop: Callable[[str], Awaitable[Any]],
        interval_s: float = 5.0,
        misses: int = 4,
    ) -> None:
        self.runtime = runtime
        self.workers = workers
        self.stop = stop
        self.interval_s = interval_s
        self.misses = misses
        self.missed: dict[str, int] = {}

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.interval_s)
            await self.look()

    async def look(self) -> None:
        """Ping every owner of a running spawned worker once; stop the workers of those gone."""
        owned: dict[str, list[str]] = {}
        for name, handle in self.workers.items():
            if handle.owner is not None and handle.returncode is None and handle.process is not None:
                owned.setdefault(handle.owner, []).append(name)
        self.missed = {owner: n for owner, n in self.missed.items() if owner in owned}
        async with anyio.create_task_group() as tg:
            for owner, names in owned.items():
                tg.start_soon(self._look_at, owner, names)

    async def gone(self, owner: str) -> bool:
        """Whether ``owner`` does not answer a ping now."""
        return not await answers(self.runtime, owner, PING_TIMEOUT_S)

    async def _look_at(self, owner: str, names: list[str]) -> None:
        if await answers(self.runtime, owner, PING_TIMEOUT_S):
            self.missed.pop(owner, None)
            return
        self.missed[owner] = self.missed.get(owner, 0) + 1
        if self.missed[owner] < self.misses:
            return
        del self.missed[owner]
        log.warning("spawn_owner_gone_stopping_workers", owner=owner, workers=names, misses=self.misses)
        for name in names:
            try:
                await self.stop(name)
            except TroupeError as exc:  # it exited meanwhile
                log.info("spawn_owner_gone_stop_failed", worker=name, error=str(exc))
