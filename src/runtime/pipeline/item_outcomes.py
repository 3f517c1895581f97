"""What becomes of an item a stage has answered for: passed on to the stages it feeds, settled
(ok, pruned, dead, kept, or an error its master retries), retried in its stage, or run again from
the first stage when the payload it needs is gone; or ok after all where, before a retry or a
dead letter, a stage that commits outputs says its output is committed (``committed_check.py``).

An item that a stage passes on to several (``after``) ends in each of their branches: it settles
once, as the last of them ends (its source told once, its outcome counted once), ok where any
ended ok (a committed output is the truth: invariant 8 of docs/DESIGN.md), else the gravest of
their ends.
Each branch's end settled it: an item one branch committed and another failed was counted ok and
then dead, or ok twice (its master's report sent for the first only).

:class:`ItemOutcomes` is the part of :class:`~troupe.runtime.pipeline.engine.PipelineEngine` that
decides this, apart from the call that brings the answer (``replica_calls.py``) and from what
goes into the queues (``dispatch.py``).
"""

from __future__ import annotations

import time
from typing import Any

from troupe.runtime.library_logging import get_logger

from .committed_check import CommittedCheck
from .records import Handle, Item, StageState

__all__ = ["ItemOutcomes"]

log = get_logger(__name__)

# How an item's end ranks among its branches' ends (``_branch_ended``): ok above all, then the
# gravest of the others.
_RANK = {"pruned": 0, "error": 1, "dead": 2, "ok": 3}


class ItemOutcomes(CommittedCheck):
    """Settles, passes on, retries and restarts items (a part of the engine)."""

    keep_outputs: bool
    kept: int  # items whose output an earlier run committed
    restarted: int
    remade: set[str]  # ended ok before, output gone: made again, retried here
    _restarts: dict[str, int]  # task id -> times run again from the first stage
    _outputs: dict[str, Any]
    _outcomes: dict[str, str]
    _errors: dict[str, str]
    _last_done: float | None
    _branches: dict[str, int]  # task id -> its branches going, where a stage passed it to several
    _branch_ends: dict[str, tuple[str, str, str]]  # task id -> its ended branches' end so far

    def _settle(self, item: Item, outcome: str, error: str = "", tb: str = "") -> None:
        ended = self._branch_ended(item.task_id, (outcome, error, tb))
        if ended is None:  # another branch of it goes on: it settles as the last one ends
            return
        outcome, error, tb = ended
        if outcome != "error":
            self._last_done = time.monotonic()
            self._outcomes[item.task_id] = outcome
            if error:
                self._errors[item.task_id] = error
        self.source.settle(item.task_id, outcome, error, tb)

    def _branch_ended(self, task_id: str, end: tuple[str, str, str]) -> tuple[str, str, str] | None:
        """One branch of ``task_id`` ended with ``end`` (outcome, error, traceback): None while
        another goes on, else the item's own end, ok where any branch ended ok, else the
        gravest."""
        going = self._branches.pop(task_id, 1) - 1
        end = max(end, self._branch_ends.pop(task_id, end), key=lambda e: _RANK.get(e[0], 0))
        if going <= 0:
            return end
        self._branches[task_id] = going
        self._branch_ends[task_id] = end
        return None

    def _keep(self, task_id: str) -> None:
        """Its output is committed already: the item is done (invariant 8), nothing runs it."""
        self.kept += 1
        self._outcomes[task_id] = "kept"
        self.source.settle(task_id, "ok")
        log.info("item_kept", task_id=task_id)

    def _forward(self, stage: StageState, item: Item, data: Any, now: float) -> None:
        downstream = self.config.downstream(stage.index)
        if not downstream:
            if self.keep_outputs:
                self._outputs[item.task_id] = data
            self._settle(item, "ok")
            return
        if isinstance(data, Handle):
            data.refs = len(downstream)
        if len(downstream) > 1:  # it ends in each branch now, and settles once (_branch_ended)
            self._branches[item.task_id] = self._branches.get(item.task_id, 1) + len(downstream) - 1
        for d in downstream:
            down = self.stages[d]
            down.queue.append(Item(item.task_id, item.seed, data, 0))
            assert down.meter is not None
            down.meter.queued(len(down.queue), now)

    def _retry(self, stage: StageState, item: Item, error: str, tb: str) -> None:
        if self.config.downstream(stage.index):  # no output of it is committed yet
            return self._retry_now(stage, item, error, tb)
        # a stage that commits outputs: it may have committed this one and failed after. Only it
        # is asked: another final stage (``after`` the same) that has the item committed says
        # nothing of this one's output, which its retry makes
        self._unless_committed(
            item, lambda: self._found(item), lambda: self._retry_now(stage, item, error, tb), [stage]
        )

    def _found(self, item: Item) -> None:
        """Its output is committed after all (``committed_check.py``): it ended ok."""
        self._consumed(item)
        self._settle(item, "ok")

    def _retry_now(self, stage: StageState, item: Item, error: str, tb: str) -> None:
        if not self._retries_here(item):  # the master decides: retry later, or dead letter
            log.warning(
                "item_failed_to_master", stage=stage.cfg.name, task_id=item.task_id, error=error, traceback=tb
            )
            self._consumed(item)
            self._settle(item, "error", error, tb)
            return
        item.attempt += 1
        if stage.index == 0 and isinstance(item.data, dict):  # the first stage is told the attempt
            item.data = {**item.data, "attempt": item.attempt}
        if item.attempt >= self.config.max_attempts:
            self._consumed(item)
            self._settle(item, "dead", error, tb)
            log.error("item_dead", stage=stage.cfg.name, task_id=item.task_id, error=error, traceback=tb)
            return
        log.warning(
            "item_retry", stage=stage.cfg.name, task_id=item.task_id, attempt=item.attempt, error=error
        )
        stage.queue.appendleft(item)

    def _retries_here(self, item: Item) -> bool:
        """The engine retries ``item`` itself: its source does not, or it is made again
        outside the source (its source has it as done)."""
        return self.source.retries_locally or item.task_id in self.remade

    def _restart(self, item: Item, why: str) -> None:
        """``item``'s payload is gone with the replica that held it: run it from the first stage
        again (an attempt, so that a run that keeps losing nodes still ends), unless a stage
        that commits outputs has its output already (another branch of the pipeline's)."""
        self._unless_committed(item, lambda: self._found(item), lambda: self._restart_now(item, why))

    def _restart_now(self, item: Item, why: str) -> None:
        self._consumed(item)
        self.restarted += 1
        n = self._restarts[item.task_id] = self._restarts.get(item.task_id, 0) + 1
        error = f"restarted from the first stage: {why}"
        log.warning("item_restarted", task_id=item.task_id, restarts=n, why=why)
        if not self._retries_here(item):  # the master runs it again, as any failed task
            self._settle(item, "error", error)
        elif n >= self.config.max_attempts:
            self._settle(item, "dead", error)
        else:
            first = self.stages[0]
            data = {"task_id": item.task_id, "seed": item.seed, "attempt": n}
            first.queue.appendleft(Item(item.task_id, item.seed, data, n))
            assert first.meter is not None
            first.meter.queued(len(first.queue), time.monotonic())
