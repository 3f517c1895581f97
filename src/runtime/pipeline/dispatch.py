"""Which items go to which replica, and when: the first stage's queue filled from the source (and
from the items made again), credits, and batches sent round by round.

A stage may take on items only while the stages it feeds have room for its results, counting
what its replicas already have in calls (:meth:`ItemDispatch._credit`): no queue ever holds
more than its bound, so memory is bounded by construction.

:class:`ItemDispatch` is the part of :class:`~troupe.runtime.pipeline.engine.PipelineEngine`
that hands out the work; the engine's loop calls it each time something moved, and the call
itself is ``replica_calls.py``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from .records import Handle, Item, Replica, StageState
from .replica_calls import ReplicaCalls
from .source import SourceItem

__all__ = ["ItemDispatch"]


class ItemDispatch(ReplicaCalls):
    """Fills the queues and sends their items to replicas within the credits (a part of the
    engine)."""

    done: Callable[[str], bool] | None  # says whether an item's output is already committed
    _committed: set[str]  # named by stages' start hooks
    _remakes: deque[SourceItem]  # ended ok before, output gone: made again
    _started: bool  # the first item went out
    _start: float  # lambda counts from the first item in

    def _credit(self, stage: StageState) -> int:
        """How many more items ``stage`` may take on without overfilling a downstream queue."""
        room = 1 << 30
        for d in self.config.downstream(stage.index):
            down = self.stages[d]
            inflight = sum(r.busy for r in stage.replicas)
            room = min(room, down.cfg.queue - len(down.queue) - inflight)
        return room

    def _fill_source(self) -> None:
        first = self.stages[0]
        now = time.monotonic()
        # Over its bound (a lost replica's items went back to its front): nothing new comes in.
        while (room := first.cfg.queue - len(first.queue)) > 0:
            taken = [self._remakes.popleft() for _ in range(min(room, len(self._remakes)))]
            taken = taken or self.source.take(room)
            if not taken:
                return
            for it in taken:
                if it.task_id in self._committed or (self.done is not None and self.done(it.task_id)):
                    self._keep(it.task_id)
                    continue
                data = {"task_id": it.task_id, "seed": it.seed, "attempt": it.attempt}
                first.queue.append(Item(it.task_id, it.seed, data, it.attempt))
                assert first.meter is not None
                first.meter.queued(len(first.queue), now)

    def _dispatch(self, stage: StageState) -> None:
        # Round by round, so that every replica has a call before any has a second.
        for depth in range(stage.cfg.inflight):
            for replica in stage.ready():
                if replica.calls > depth or not stage.queue:
                    continue
                n = min(stage.cfg.batch, len(stage.queue), self._credit(stage))
                if n <= 0:
                    return
                batch = self._what_fits(stage, replica, self._take(stage, n))
                if batch:
                    self._send(stage, replica, batch)

    def _take(self, stage: StageState, n: int) -> list[Item]:
        """Up to ``n`` items from the front of ``stage``'s queue; one whose input is held by a
        replica lost since it was queued (put back behind a call of a replica lost with it, say)
        runs again from the first stage instead: a pull from it would wait out its timeout."""
        batch: list[Item] = []
        while len(batch) < n and stage.queue:
            item = stage.queue.popleft()
            if isinstance(item.data, Handle) and item.data.holder.lost:
                self._restart(item, f"replica {item.data.holder.name} holding its payload is gone")
            else:
                batch.append(item)
        return batch

    def _send(self, stage: StageState, replica: Replica, batch: list[Item]) -> None:
        assert self._tg is not None and stage.meter is not None
        now = time.monotonic()
        if not self._started:  # lambda is measured from the first item in, not from spawning
            self._started = True
            self._start = now
        if replica.calls == 0:
            replica.last_reply = now  # it was idle: its service starts now, not at its last reply
        replica.busy += len(batch)
        replica.calls += 1
        stage.meter.dispatched(len(batch), len(stage.queue), now)
        self._tg.start_soon(self._call, stage, replica, batch)
