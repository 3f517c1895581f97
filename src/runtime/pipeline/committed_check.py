"""Whether an item about to be retried, run again or dead-lettered has its output committed.

A stage that commits the items' outputs (the dataset writer's store) may commit one and then
die or fail before it answers (killed, its node lost): the item was retried, or settled dead on
its last attempt, while its output was in the dataset, which the run's finalize then took (the
run said "1 dead" of 4 episodes; report jx 4). So before that, the engine asks a replica of a
stage that defines the hook ``committed_among(task_ids)`` (returning those of the ids whose
output is committed), and an item whose output is there ends ok: the commit is the truth, as a
rerun's "found committed" takes it. A stage without the hook is not asked (nothing changes).
Before the retry of an item a final stage failed, that stage only: another final stage's commit
of the item (one ``after`` the same stage) says nothing of this one's output, and was taken for
it (pl 2b); before an item whose payload was lost runs again, each stage that defines it.

:class:`CommittedCheck` is the part of :class:`~troupe.runtime.pipeline.engine.PipelineEngine`
that asks; ``item_outcomes.py`` decides what comes of the answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from troupe.runtime.errors import TroupeError
from troupe.runtime.library_logging import get_logger

from .handle_ledger import HandleLedger
from .hook_calls import STARTED_S
from .records import Item, StageState

__all__ = ["COMMITTED_HOOK", "CommittedCheck"]

log = get_logger(__name__)

COMMITTED_HOOK = "committed_among"
_ASK_S = 60.0  # one question to a replica: a look at a few directories
_LOOK_S = 0.05  # between looks for a replica of the stage, while its lost one is replaced


class CommittedCheck(HandleLedger):
    """Asks the stages that commit outputs whether an item's is committed (a part of the
    engine)."""

    def _unless_committed(
        self,
        item: Item,
        found: Callable[[], None],
        then: Callable[[], None],
        asked: list[StageState] | None = None,
    ) -> None:
        """``found()`` where a stage says ``item``'s output is committed, else ``then()`` (its
        retry, run again, or dead letter): at once where no stage can say. ``asked``: the
        stages that may say (default: every stage)."""
        stages = [s for s in (self.stages if asked is None else asked) if COMMITTED_HOOK in s.hooks]
        if not stages or self._tg is None:
            then()
            return
        self._asking += 1
        self._tg.start_soon(self._ask_then, item, found, then, stages)

    async def _ask_then(
        self, item: Item, found: Callable[[], None], then: Callable[[], None], stages: list[StageState]
    ) -> None:
        try:
            committed = await self._committed_now(item.task_id, stages)
        finally:
            self._asking -= 1
            self._changed.set()  # the dispatch loop looks again: the item has ended, or is back
        if committed:
            log.info("item_found_committed", task_id=item.task_id)
            found()
        else:
            then()

    async def _committed_now(self, task_id: str, stages: list[StageState]) -> bool:
        """Whether a replica of one of ``stages`` names ``task_id`` committed; False where none
        answers (the item goes on as it would have)."""
        for stage in stages:
            if not stage.ready() and not stage.starting:  # the scaler gave back a drained stage's
                self._spawn(stage)
            deadline = time.monotonic() + STARTED_S
            while not stage.ready() and time.monotonic() < deadline:  # its lost one is replaced
                await anyio.sleep(_LOOK_S)
            ready = stage.ready()
            if not ready:
                continue
            ref = ready[0].ref
            assert ref is not None
            try:
                reply = await ref.ask("stage_committed", {"task_ids": [task_id]}, timeout=_ASK_S)
            except TroupeError as exc:
                log.warning("item_commit_unknown", stage=stage.cfg.name, task_id=task_id, error=str(exc))
                continue
            if isinstance(reply, dict) and task_id in (reply.get("committed") or ()):
                return True
        return False
