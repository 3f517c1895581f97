"""The engine's ledger of the outputs replicas hold for a next stage (the direct data plane's
handles): each handle counts the stages yet to settle its item, and once none is left its holder
is told it may forget the output, one message per holder for all the keys freed meanwhile.

:class:`HandleLedger` is the part of :class:`~troupe.runtime.pipeline.engine.PipelineEngine` that
keeps these counts: the engine moves ids and sizes, and this is all it tracks of a payload. What
a holder that is lost costs the items is ``lost_holders.py``.
"""

from __future__ import annotations

from troupe.runtime.errors import TroupeError
from troupe.runtime.library_logging import get_logger

from .records import Handle, Item, Replica
from .replicas import ReplicaPool

__all__ = ["HandleLedger"]

log = get_logger(__name__)


class HandleLedger(ReplicaPool):
    """Frees the outputs held upstream once every stage they feed has settled their item (a
    part of the engine)."""

    _releases: dict[str, tuple[Replica, list[str]]]  # holder name -> keys to release

    def _consumed(self, item: Item) -> None:
        """``item``'s stage settled it: its input, if held upstream, may go once every stage
        it feeds has."""
        handle = item.data
        if not isinstance(handle, Handle):
            return
        handle.refs -= 1
        if handle.refs > 0:
            return
        holder = handle.holder
        holder.held = max(0, holder.held - 1)
        if not holder.lost:
            self._releases.setdefault(holder.name, (holder, []))[1].append(handle.key)

    def _flush_releases(self) -> None:
        """Tell each holder the outputs it may forget (one message per holder)."""
        if not self._releases or self._tg is None:
            return
        releases, self._releases = self._releases, {}
        for holder, keys in releases.values():
            self._tg.start_soon(self._release, holder, keys)

    async def _release(self, holder: Replica, keys: list[str]) -> None:
        try:
            await self.runtime.ref(holder.outbox).tell("stage_release", {"keys": keys})
        except TroupeError as exc:  # gone with its node: nothing left to free
            log.info("release_failed", replica=holder.name, error=str(exc))
