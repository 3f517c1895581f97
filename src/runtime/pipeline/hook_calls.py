"""The engine's calls of the stages' hooks: ``start`` once every first replica is up, before any
item moves (what it names as committed is kept, and the items earlier runs ended ok whose output
it lacks are made again), and ``finalize`` once every item has its outcome, in stage order, but
for a run that made nothing: every item died or was pruned (this run's and earlier runs'
together), and no output is anywhere. A finalize over nothing could only fail (the dataset
writer's did, with "no committed episodes", and that error stood where the run's own line, the
items' ends and the way out, belonged; reports ev 8, and the same for a planner that pruned
every item).

:class:`HookCalls` is the part of :class:`~troupe.runtime.pipeline.engine.PipelineEngine` that
calls them; the hooks themselves run in the stage actor (``stage.py``).
"""

from __future__ import annotations

import errno
import os
from collections import deque
from typing import Any

import anyio

from troupe.runtime.errors import PeerLost, RemoteError, StageFailed, TroupeError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.start_limits import remote_limit_reached
from troupe.runtime.tasks.jobspec import generated_task_id

from .first_output import FirstOutput
from .records import StageState
from .replicas import ReplicaPool
from .source import SourceItem
from .stage import StageRun

__all__ = ["STARTED_S", "HookCalls"]

log = get_logger(__name__)

STARTED_S = 300.0
"""The longest the engine waits for the replicas it starts before any item moves (every stage's
first), or for a finalize hook's: past it the run fails in one line that names the stage and
the nodes where its replicas were still starting (over a link too slow or down, a replica's
start never ends: its tries run out only after many minutes)."""


class HookCalls(ReplicaPool):
    """Waits for the first replicas and runs the stages' start and finalize hooks (a part of
    the engine)."""

    out: str | None
    fresh: bool
    remade: set[str]
    _committed: set[str]  # named by stages' start hooks
    _outputs_listed: bool  # a start hook named every committed output (even none)
    _remakes: deque[SourceItem]  # ended ok before, output gone: made again
    _finals: dict[str, dict[str, Any]]
    _outcomes: dict[str, str]  # by task id, this run's
    _errors: dict[str, str]  # by task id: why this run's pruned or dead items ended
    kept: int  # items whose output an earlier run committed
    made_nothing: bool  # every item died or was pruned, and no output is anywhere
    _first_output: FirstOutput  # told before the run may first make something

    async def _made_nothing(self) -> bool:
        """Whether the run ends with no item's output anywhere: none ended ok here, no stage
        named one committed, and no earlier run ended one ok (every item it ended died, those
        the source's ``dead_before``, or was pruned). Asked of the master only where this run
        made nothing and an earlier one ended items it cannot tell apart so."""
        if self.config.items <= 0 or self.kept or self._committed:
            return False
        if any(outcome == "ok" for outcome in self._outcomes.values()):
            return False
        before = getattr(self.source, "ended_before", None) or 0
        if before <= len(getattr(self.source, "dead_before", ())) or self._outputs_listed:
            return True  # earlier runs ended none ok, or a stage lists every output: none
        name = self.config.name
        return not await self.source.ended_ok(generated_task_id(name, i) for i in range(self.config.items))

    def _dead_of_a_full_disk(self, exc: TroupeError) -> str:
        """For a finalize that failed of a full disk: the items of this run that died of one
        too (their commits failed), and the way to make them: a rerun without --retry-dead
        finalised the rest and exited 0 with them missing."""
        if not _disk_full(str(exc)):
            return ""
        dead = [t for t, o in self._outcomes.items() if o == "dead" and _disk_full(self._errors.get(t, ""))]
        if not dead:
            return ""
        return (
            f"; {len(dead)} item(s) of this run died of a full disk too (dead-lettered): once there "
            "is room, run it again with --retry-dead, or they stay dead"
        )

    async def _wait_started(self, hook: str = "") -> None:
        """Wait until no replica is starting (each up, or failed), :data:`STARTED_S` at most.

        ``hook``: the hook a replica is started for (``finalize``), "" at the run's start.

        Raises:
            StageFailed: a stage could get no replica; or one was still starting after
                :data:`STARTED_S` (it was a bare TimeoutError, shown as a traceback).
        """
        with anyio.move_on_after(STARTED_S):
            while any(s.starting for s in self.stages):  # every first replica up, or failed
                await self._changed.wait()
                self._changed = anyio.Event()
        if self._fatal is not None:
            raise self._fatal
        waiting = [s for s in self.stages if s.starting]
        if waiting:
            raise self._not_started(waiting, hook)

    def _not_started(self, waiting: list[StageState], hook: str) -> StageFailed:
        """The run's error for stages whose replicas were still starting after :data:`STARTED_S`."""
        names = ", ".join(s.cfg.name for s in waiting)
        nodes = sorted({n for s in waiting for n in self._starting_on(s)})
        on = f" on node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)}" if nodes else ""
        log.error("replicas_not_started", stages=names, nodes=nodes, hook=hook, waited_s=STARTED_S)
        head = f"stage {names}: no replica started within {STARTED_S:g} s"
        why = (
            f"(one was still starting{on}: the link from this host to it may be slow or down, or "
            "the node too busy; the run log says more)"
        )
        if hook != "finalize":
            return StageFailed(
                f"{head} {why}; no item moved: run the same command again (what earlier runs "
                "committed is kept)"
            )
        done = "every item has its outcome, and the finalize hook did not run"
        if self.out is not None:
            done += (
                f": the same command run again into the same --out ({self.out}) finalises what "
                "they committed (nothing is lost)"
            )
        return StageFailed(f"{head} to run its finalize hook {why}; {done}")

    def _starting_on(self, stage: StageState) -> list[str]:
        """The nodes where replicas of ``stage`` were asked to start and have not come up."""
        prefix = f"{self.config.name}-{stage.cfg.name}-"
        up = {r.name for r in stage.replicas}
        return [
            host.name
            for name, host in self._launched.items()
            if name.startswith(prefix) and name[len(prefix) :].isdigit() and name not in up
        ]

    def _stage_run(self, stage: StageState) -> dict[str, Any]:
        return StageRun(
            self.config.name, stage.cfg.name, self.config.items, self.config.seed_start, self.out, self.fresh
        ).to_wire()

    async def _start_hooks(self) -> None:
        """Each stage's ``start``, before any item moves; what they name as committed is kept."""
        for stage in self.stages:
            if "start" not in stage.hooks:
                continue
            replica = stage.ready()[0]
            assert replica.ref is not None
            try:
                reply = await replica.ref.ask("stage_start", self._stage_run(stage), timeout=3600)
            except TroupeError as exc:
                raise _hook_failed(stage.cfg.name, "start", exc) from exc
            committed = reply.get("committed", []) if isinstance(reply, dict) else []
            self._committed.update(str(t) for t in committed)
            self._outputs_listed |= isinstance(reply, dict) and reply.get("every") is True
            log.info("stage_started", stage=stage.cfg.name, committed=len(committed))

    async def _find_lost_outputs(self) -> None:
        """The items that earlier runs ended ok but whose outputs the start hooks do not name
        (deleted since): they run again, or the run would end short of them."""
        if not self._outputs_listed:
            return
        name, start = self.config.name, self.config.seed_start
        ids = (generated_task_id(name, i) for i in range(self.config.items))
        lost = sorted(await self.source.ended_ok(t for t in ids if t not in self._committed))
        if not lost:
            return
        self.remade = set(lost)
        self._remakes.extend(SourceItem(t, start + int(t.rpartition("-")[2])) for t in lost)
        shown = ", ".join(lost[:3]) + (f" and {len(lost) - 3} more" if len(lost) > 3 else "")
        log.warning("items_remade", count=len(lost), task_ids=lost[:20])
        if self.on_event is not None:
            self.on_event(
                f"{len(lost)} item(s) that earlier runs made have no committed output (deleted since, "
                f"or found damaged and set aside): "
                f"made again: {shown}"
            )

    async def _finalize_hooks(self) -> None:
        """Each stage's ``finalize``, in stage order, once every item has its outcome; none
        where the run made nothing (:meth:`_made_nothing`)."""
        if await self._made_nothing():
            self.made_nothing = True
            log.warning("finalize_skipped", why="no item made an output", items=self.config.items)
            return
        if any("finalize" in stage.hooks for stage in self.stages):
            await self._first_output.coming()  # the run's code recorded first (first_output.py)
        for stage in self.stages:
            if "finalize" not in stage.hooks:
                continue
            if not stage.ready():  # the scaler gave back a drained stage's replicas
                self._spawn(stage)
                await self._wait_started("finalize")
            ready = stage.ready()
            if not ready:
                raise StageFailed(f"stage {stage.cfg.name}: no replica could start to finalize")
            replica = ready[0]
            assert replica.ref is not None
            log.info("stage_finalizing", stage=stage.cfg.name, replica=replica.name)
            replica.busy += 1  # nothing retires it meanwhile
            try:
                summary = await replica.ref.ask("stage_finalize", self._stage_run(stage), timeout=24 * 3600)
            except TroupeError as exc:
                raise _hook_failed(stage.cfg.name, "finalize", exc, self._dead_of_a_full_disk(exc)) from exc
            finally:
                replica.busy -= 1
            self._finals[stage.cfg.name] = dict(summary) if isinstance(summary, dict) else {}


def _disk_full(error: str) -> bool:
    """Whether an error's text says a disk or quota was full (ENOSPC, EDQUOT)."""
    return any(os.strerror(code) in error for code in (errno.ENOSPC, errno.EDQUOT))


def _hook_failed(stage: str, hook: str, exc: TroupeError, also: str = "") -> StageFailed:
    """The run's error for a hook that raised or whose replica ended in it; a hook's traceback
    goes to the run's log (``stage_hook_failed``), as a constructor's does. ``also``: what the
    run's items say of the same cause (``HookCalls._dead_of_a_full_disk``)."""
    said = f"stage {stage}: {hook} failed: {exc}{also}"
    if isinstance(exc, RemoteError):
        log.error("stage_hook_failed", stage=stage, hook=hook, error=str(exc), traceback=exc.remote_traceback)
        said += " (its traceback: the run log's stage_hook_failed line)"
        limit = remote_limit_reached(exc.remote_type, exc.remote_message)
        if limit is not None:  # "can't start new thread" names no limit
            said += f"; {limit}"
    elif isinstance(exc, PeerLost):
        # Most often killed as hung: a hook is a handler, held to progress_timeout_s as one.
        said += (
            f"; the replica's process ended in its {hook} hook (the run log's worker_killed or "
            "worker_exited line says why: a hook that runs longer than progress_timeout_s "
            "without self.progress() is killed as hung)"
        )
    return StageFailed(said)
