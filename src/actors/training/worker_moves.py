"""The workers of one training run moved off nodes that are gone: at a restart, the ranks and
encoders whose node the master no longer lists are started on live nodes that fit them
(``lost_nodes``); while the ranks train, an encoder whose node stops answering is started again
on a live node (``_watch_encoders``), restarting no rank; and where such a node was only cut off
and answers again, the encoder it kept is stopped there (``_watch_left_behind``).

:class:`WorkerMoves` is a part of :class:`~troupe.actors.training.train_driver.TrainDriver`: it
uses the driver's fields.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio

from troupe.runtime import TroupeError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.placement import Host

from .lost_nodes import live_hosts, moves, silent_nodes
from .train_cluster import stop_worker
from .train_workers import ENCODER_CLASS, TrainWorkers

__all__ = ["WATCH_S", "WorkerMoves"]

log = get_logger(__name__)

WATCH_S = 2.0  # how often the encoders' nodes are pinged while the ranks train


class WorkerMoves(TrainWorkers):
    """Moves the workers off nodes that are gone, and stops those left behind (a part of the
    driver)."""

    # Encoders moved off a node that stopped answering, by (worker, that host): its node may
    # only be cut off, holding them; each is stopped there once it answers again.
    left_behind: list[tuple[str, Host]]
    _moving: anyio.Lock  # the encoders' watch and a restart move them one at a time
    _unplaced: set[str]  # encoders said to have no live node to go to

    async def _leave_lost_nodes(self) -> None:
        if self.master is None:  # the run's own node: it lives as long as the run
            return
        placed = [r.host for r in self.ranks] + [h for _, _, h in self.encoders]
        live = await live_hosts(self.rt, self.master, placed)
        if live is None:
            return
        tr = self.cfg.trainers
        for i, host in moves([r.host for r in self.ranks], live, tr.tags, tr.gpus, "trainers").items():
            rank = self.ranks[i]
            self._moved(rank.worker, rank.host, host)
            rank.host = host
        async with self._moving:
            await self._move_encoders(live)

    async def _move_encoders(self, live: list[Host]) -> None:
        """The encoders whose node is not among ``live`` started on live nodes that fit them."""
        enc = self.cfg.encoders
        moved = moves([h for _, _, h in self.encoders], live, enc.tags, enc.gpus, "encoders")
        if moved:
            kwargs = self._encoder_kwargs()
            async with anyio.create_task_group() as tg:
                for i, host in moved.items():
                    actor, worker, old = self.encoders[i]
                    self._moved(worker, old, host)
                    if self._left_on(worker, old) is None:
                        self.left_behind.append((worker, old))
                    self.encoders[i] = (actor, worker, host)
                    tg.start_soon(self._spawn_moved_encoder, actor, worker, host, kwargs)

    async def _spawn_moved_encoder(self, actor: str, worker: str, host: Host, kwargs: dict[str, Any]) -> None:
        """Spawn a moved encoder on ``host``; one of its name this run left behind there (moved
        off it before, its node silent since) is stopped first: the node refuses a second."""
        left = self._left_on(worker, host)
        if left is not None:
            self.left_behind.remove(left)
            await stop_worker(self.controls, worker, left[1])
        await self._spawn(worker, "encoder", actor, ENCODER_CLASS, kwargs, host)

    def _left_on(self, worker: str, host: Host) -> tuple[str, Host] | None:
        """The entry of ``left_behind`` for ``worker`` on ``host``'s node (by its name: the
        master's list of it may say another state, drained say, since)."""
        return next((e for e in self.left_behind if e[0] == worker and e[1].name == host.name), None)

    async def _watch_encoders(self) -> None:
        """While the ranks train, an encoder whose node stops answering is started again on a live
        node; the ranks take it back at their next probe of it (``inflight``), resolving its name
        afresh. Without this, the other encoders carried its share until the ranks restarted.
        One that cannot be placed (no live node fits) or started is said once; the run goes on."""
        assert self.master is not None
        while True:
            await anyio.sleep(WATCH_S)
            hosts = [h for _, _, h in self.encoders]
            silent = await silent_nodes(self.rt, hosts)
            if not silent:
                continue
            try:
                async with self._moving:
                    live = await live_hosts(self.rt, self.master, hosts)
                    if live is not None:
                        await self._move_encoders(live)
            except* TroupeError as group:  # no node fits, or a spawn failed (in a task group)
                self._not_replaced(sorted(silent), group.exceptions[0])

    async def _watch_left_behind(self) -> None:
        """While the ranks train, the nodes encoders were moved off are pinged every round; those
        left behind on one that answers again (a cut link mended) are stopped there: such a node
        kept them running through the cut and rejoined the master with them, under the names
        their replacements have, until the run ended. The stop names this run's process and that
        node alone: it cannot reach the replacement on another node. A loop of its own: a node
        that stays dead holds each ping its whole deadline, which the encoders' watch would wait."""
        while True:
            await anyio.sleep(WATCH_S)
            left = list(self.left_behind)
            if left:
                silent = await silent_nodes(self.rt, [host for _, host in left])
                await self._stop_left_behind([e for e in left if e[1].name not in silent])

    async def _stop_left_behind(self, answering: list[tuple[str, Host]]) -> None:
        if not answering:
            return
        async with self._moving:  # a restart's move may have spawned one there since the ping
            back = [entry for entry in answering if entry in self.left_behind]
            for entry in back:
                self.left_behind.remove(entry)
            async with anyio.create_task_group() as tg:
                for worker, host in back:
                    tg.start_soon(self._stop_one_left_behind, worker, host)

    async def _stop_one_left_behind(self, worker: str, host: Host) -> None:
        if not await stop_worker(self.controls, worker, host):
            return  # not there (its node restarted since), or silent again: nothing stopped to say
        log.warning("train_worker_left_behind_stopped", worker=worker, node=host.name)
        self.say(f"{worker}: node {host.name} answers again; the one left running there is stopped")

    def _not_replaced(self, nodes: list[str], error: BaseException) -> None:
        lost = ", ".join(nodes)
        if lost in self._unplaced:  # the watch tries again every round: said once
            return
        self._unplaced.add(lost)
        log.warning("train_encoder_not_replaced", nodes=lost, error=str(error))
        self.say(f"the encoders of node(s) {lost}, gone, are not started elsewhere ({error}); the rest go on")

    def _moved(self, worker: str, gone: Host, to: Host) -> None:
        with contextlib.suppress(ValueError):  # its node took it: no stop to send there at the end
            self.spawned.remove((worker, gone))
        log.warning("train_worker_moved", worker=worker, gone=gone.name, to=to.name)
        self.say(f"{worker}: node {gone.name} is gone; it starts again on {to.name}")
