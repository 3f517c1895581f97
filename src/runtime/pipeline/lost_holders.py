"""A replica lost with the outputs it held for a next stage: the items queued with them run again
from the first stage, and the replicas that may be pulling from it are told to stop waiting.

:class:`LostHolders` is the part of :class:`~troupe.runtime.pipeline.engine.PipelineEngine` that
answers :class:`~troupe.runtime.pipeline.replicas.ReplicaPool`'s ``_lose_outputs`` (a replica
replaced or lost takes what it held with it), and a call's answer that its input's holder no
longer has it.
"""

from __future__ import annotations

from collections import deque

from troupe.runtime.errors import TroupeError
from troupe.runtime.library_logging import get_logger

from .item_outcomes import ItemOutcomes
from .records import Handle, Item, Replica

__all__ = ["LostHolders"]

log = get_logger(__name__)


class LostHolders(ItemOutcomes):
    """Runs again the items whose held payload is gone with its replica (a part of the engine)."""

    def _lose_outputs(self, replica: Replica) -> None:
        """``replica`` is gone: the items queued for a next stage with their payload held there
        run again from the first stage."""
        replica.lost = True
        lost: list[Item] = []
        for stage in self.stages:
            kept: deque[Item] = deque()
            for it in stage.queue:
                is_lost = isinstance(it.data, Handle) and it.data.holder is replica
                (lost if is_lost else kept).append(it)
            stage.queue = kept
        for it in lost:
            self._restart(it, f"replica {replica.name} holding its payload is gone")
        replica.held = 0
        if self._direct and self._tg is not None:  # replicas pulling from it stop waiting for it
            for stage in self.stages:
                for other in stage.replicas:
                    if other is not replica and other.busy and not other.lost:
                        self._tg.start_soon(self._tell_gone, other, replica.outbox)

    async def _tell_gone(self, replica: Replica, holder: str) -> None:
        try:
            await self.runtime.ref(replica.outbox).tell("stage_holder_gone", {"holder": holder})
        except TroupeError as exc:
            log.info("holder_gone_not_told", replica=replica.name, error=str(exc))

    def _holder_gone(self, item: Item) -> None:
        """The replica holding ``item``'s input no longer has it: its process died (and its node
        may have restarted it, empty, at another endpoint than this engine's ref knows), or it
        cannot be reached."""
        handle = item.data
        if not isinstance(handle, Handle):
            return
        stage = next((s for s in self.stages if handle.holder in s.replicas), None)
        if stage is not None:
            self._lose(stage, handle.holder, "replica_lost_outputs", "it no longer has the outputs it held")
