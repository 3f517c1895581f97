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

A request may also name its owner's process (``owner_process``: ``process_identity``). Where that
is a process of the node's own host (or of its pid space: a network-namespace cluster on one
machine) and it no longer runs, the owner is gone at once, whatever answers at its endpoint: the
watch stops its workers at its next look rather than after ``misses`` of them, and a rerun takes
their names without a ping's wait.

A run that the node cannot ping (a cluster run, listening on its own host's loopback) names
itself ``master:<token>`` instead, and beats to the master while its replicas run: the node
asks the master how long the run has been silent (``owner_seen``, ``tasks/master/run_owners.py``)
and stops its workers once that passes ``OWNER_SILENT_S``. A master that does not answer says
nothing: the workers run on (a master restarting must not stop every run's replicas). A rerun's
request for the name waits for the verdict (at most ``OWNER_SILENT_S`` and a beat): a run that
lives beats again within ``OWNER_BEAT_S``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from troupe.runtime.core.client import answers
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import TroupeError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.process_identity import gone_here

from .worker_handles import WorkerHandle

__all__ = ["MASTER_OWNER", "OWNER_BEAT_S", "OWNER_SILENT_S", "OwnerWatch", "master_verdict", "silent_s"]

log = get_logger(__name__)

PING_TIMEOUT_S = 5.0  # a run's process on a loaded machine may answer late: not gone
MASTER_OWNER = "master:"  # an owner the master vouches for: ``master:<token>``
OWNER_BEAT_S = 5.0  # how often such a run beats to the master
OWNER_SILENT_S = 20.0  # silent this long (four beats missed): the run is gone
_VERDICT_POLL_S = 1.0


class OwnerWatch:
    """Stops the spawned workers whose owner stopped answering.

    Args:
        runtime: the node's runtime (it pings the owners).
        workers: the node's worker records, by name.
        stop: stops a worker by name, as the node's ``stop_worker`` control does.
        interval_s: how often the owners are pinged.
        misses: pings in a row an owner may miss before its workers are stopped.
        master: the master that vouches for ``master:`` owners (None: they are never gone).
    """

    def __init__(
        self,
        runtime: Runtime,
        workers: dict[str, WorkerHandle],
        stop: Callable[[str], Awaitable[Any]],
        interval_s: float = 5.0,
        misses: int = 4,
        master: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.master = master
        self.workers = workers
        self.stop = stop
        self.interval_s = interval_s
        self.misses = misses
        self.missed: dict[str, int] = {}
        self._pinged: set[str] = set()  # owners with a connection from a ping, closed once unowned

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.interval_s)
            await self.look()

    async def look(self) -> None:
        """Ping every owner of a running spawned worker once; stop the workers of those gone."""
        owned: dict[str, list[str]] = {}
        killed: dict[str, list[str]] = {}  # owners whose process is gone here: no ping needed
        for name, handle in self.workers.items():
            if handle.owner is not None and handle.returncode is None and handle.process is not None:
                into = killed if gone_here(handle.owner_process) else owned
                into.setdefault(handle.owner, []).append(name)
        self.missed = {owner: n for owner, n in self.missed.items() if owner in owned}
        # A run that ended owns no worker here any more: the connection its pings opened goes
        # too. Kept, one per run for the node's life, they ran a long-lived node out of sockets.
        for owner in self._pinged - owned.keys():
            self.runtime.transport.forget(owner)
        self._pinged &= owned.keys()
        async with anyio.create_task_group() as tg:
            for owner, names in killed.items():
                tg.start_soon(self._stop_all, owner, names, "its process is gone")
            for owner, names in owned.items():
                tg.start_soon(self._look_at, owner, names)

    async def gone(self, owner: str, process: str = "") -> bool:
        """Whether ``owner`` is gone: its ``process`` (``process_identity``) no longer runs on
        this host, or it does not answer a ping now; for a ``master:`` owner, whether the
        master has not heard from it for ``OWNER_SILENT_S`` (:func:`master_verdict`)."""
        if gone_here(process):
            return True
        if not owner.startswith(MASTER_OWNER):
            self._pinged.add(owner)
            return not await answers(self.runtime, owner, PING_TIMEOUT_S)
        return self.master is not None and await master_verdict(self.runtime, self.master, owner) is True

    async def _look_at(self, owner: str, names: list[str]) -> None:
        if owner.startswith(MASTER_OWNER):
            silent = None if self.master is None else await silent_s(self.runtime, self.master, owner)
            if silent is not None and silent > OWNER_SILENT_S:
                await self._stop_all(owner, names, f"the master has not heard from it for {silent:.0f} s")
            return
        self._pinged.add(owner)
        if await answers(self.runtime, owner, PING_TIMEOUT_S):
            self.missed.pop(owner, None)
            return
        self.missed[owner] = self.missed.get(owner, 0) + 1
        if self.missed[owner] < self.misses:
            return
        del self.missed[owner]
        await self._stop_all(owner, names, f"{self.misses} pings unanswered")

    async def _stop_all(self, owner: str, names: list[str], why: str) -> None:
        log.warning("spawn_owner_gone_stopping_workers", owner=owner, workers=names, why=why)
        for name in names:
            try:
                await self.stop(name)
            except TroupeError as exc:  # it exited meanwhile
                log.info("spawn_owner_gone_stop_failed", worker=name, error=str(exc))


async def master_verdict(
    runtime: Runtime, master: str, owner: str, unheard_is_gone: bool = False
) -> bool | None:
    """Whether the run ``owner`` (``master:<token>``) is gone, as its master says: True once the
    master has not heard from it for ``OWNER_SILENT_S``, False when a beat comes first (it
    lives: within ``OWNER_BEAT_S``), None when the master cannot say. Waits for the verdict,
    ``OWNER_SILENT_S`` and a beat at most. ``unheard_is_gone``: an owner that never beat since
    the master started is gone at once (a run beats before it registers for a job's items; a
    node must not take a master's restart for every run gone)."""
    seen = await _seen(runtime, master, owner)
    if seen is not None and unheard_is_gone and not seen[1]:
        return True
    before = None if seen is None else seen[0]
    with anyio.move_on_after(OWNER_SILENT_S + OWNER_BEAT_S):
        while before is not None and before <= OWNER_SILENT_S:
            await anyio.sleep(_VERDICT_POLL_S)
            now = await silent_s(runtime, master, owner)
            if now is not None and now < before:
                return False  # it beat since
            before = now
    return None if before is None else before > OWNER_SILENT_S


async def silent_s(runtime: Runtime, master: str, owner: str) -> float | None:
    """How long ``master`` has not heard from ``owner``; None when it cannot say (it does not
    answer: restarting, or a master of before ``owner_seen``)."""
    seen = await _seen(runtime, master, owner)
    return None if seen is None else seen[0]


async def _seen(runtime: Runtime, master: str, owner: str) -> tuple[float, bool] | None:
    try:
        reply = await runtime.control(master, "owner_seen", {"owner": owner}, timeout=PING_TIMEOUT_S)
    except TroupeError as exc:
        log.info("spawn_owner_unknown", owner=owner, error=str(exc))
        return None
    silent = reply.get("silent_s") if isinstance(reply, dict) else None
    if not isinstance(silent, (int, float)) or isinstance(silent, bool):
        return None
    return float(silent), reply.get("heard") is not False
