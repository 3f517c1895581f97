"""The pipeline engine: stages of replicas joined by bounded, credit-based queues.

The engine runs beside a node (it talks to it with control messages) and owns:

- one bounded input queue per stage. A replica is given items only while the stages it feeds
  have room for its results, counting what is already in flight: a producer with no credit
  waits, so no queue ever holds more than its bound and memory is bounded by construction;
- the replicas: worker processes with one stage actor each, started and stopped through the
  node (``spawn_worker`` / ``stop_worker``). Each replica has up to its stage's ``inflight``
  calls outstanding: the actor takes them one at a time, so its next item is already in its
  mailbox when it finishes one and it never idles waiting for the engine;
- the stage hooks (``stage``): ``start`` once before the first item, ``finalize`` once after
  the last;
- the scaler: when a stage has drained, its slots go to the bottleneck; replicas also follow
  the backlog within each stage's bounds (``pipeline_model.decide_scaling``);
- the meters behind the throughput model (``pipeline_model``).

Items are dicts. The first stage receives ``{"task_id", "seed", "attempt"}`` (attempt counts
from 0); every stage's
``ok`` output is the next stage's input. An item pruned by a stage is counted and never passed
on; an item whose stage call errs is retried there up to ``max_attempts``, then dead. An item
whose output is already there (``done``: committed by an earlier, interrupted run) is kept as
it is: settled ok at once, no stage runs it again. A stage's ``start`` hook may name such items.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from troupe.runtime.core.ref import ActorRef
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import StageFailed, TroupeError, UnknownMessageType

from .config import PipelineConfig, StageConfig
from .model import (
    ScaleInput,
    StageMeter,
    decide_scaling,
    pipeline_metrics,
)
from .result import PipelineMetrics, PipelineResult
from .source import ItemSource, LocalSource
from .stage import StageRun

__all__ = ["Item", "PipelineEngine"]

log = structlog.get_logger(__name__)

_START_S = 120.0  # a replica's process start (torch imports on a busy machine take a while)


@dataclass(slots=True)
class Item:
    """One task on its way through the stages."""

    task_id: str
    seed: int
    data: Any
    attempt: int = 0


@dataclass
class _Replica:
    name: str
    ref: ActorRef | None = None
    busy: int = 0  # items in its outstanding calls
    calls: int = 0  # outstanding calls (at most the stage's inflight)
    last_reply: float = 0.0  # when its last call answered: the next one's service starts then
    retiring: bool = False


@dataclass
class _Stage:
    index: int
    cfg: StageConfig
    queue: deque[Item] = field(default_factory=deque)
    replicas: list[_Replica] = field(default_factory=list)
    starting: int = 0
    meter: StageMeter | None = None
    hooks: tuple[str, ...] = ()

    def ready(self) -> list[_Replica]:
        return [r for r in self.replicas if r.ref is not None and not r.retiring]


class PipelineEngine:
    """Runs a pipeline's items through its stages on one node.

    Args:
        config: the pipeline declaration.
        runtime: a runtime that can reach the node (``client.connect``).
        node_endpoint: the node that hosts the replicas' worker processes.
        on_change: called with fresh metrics when items move, at most every ``on_change_every_s``
            (and once every item has its outcome): a progress display.
        source: where items come from (default: the config's seed range).
        done: says whether an item's output is already committed (a rerun); such an item is
            settled ok with its source and counted in :attr:`kept`, not in the metrics. The
            stages' ``start`` hooks add to it.
        keep_outputs: keep the last stage's output of every ok item for the result.
        out: the run's output directory, told to the stage hooks.
        fresh: the run starts anew, told to the stage hooks.
    """

    def __init__(
        self,
        config: PipelineConfig,
        runtime: Runtime,
        node_endpoint: str,
        on_change: Callable[[PipelineMetrics], None] | None = None,
        source: ItemSource | None = None,
        done: Callable[[str], bool] | None = None,
        keep_outputs: bool = False,
        out: str | None = None,
        fresh: bool = False,
        on_change_every_s: float = 0.05,
    ) -> None:
        self.config = config
        self.done = done
        self.keep_outputs = keep_outputs
        self.out = out
        self.fresh = fresh
        self.on_change_every_s = on_change_every_s
        self._committed: set[str] = set()  # named by stages' start hooks
        self._outputs: dict[str, Any] = {}
        self._finals: dict[str, dict[str, Any]] = {}
        self.kept = 0  # items whose output an earlier run committed
        self.runtime = runtime
        self.node_endpoint = node_endpoint
        self.on_change = on_change
        self.stages = [_Stage(i, s, meter=StageMeter(s.name, s.queue)) for i, s in enumerate(config.stages)]
        self.source = source or LocalSource(config.name, config.items, config.seed_start)
        self._outcomes: dict[str, str] = {}
        self._errors: dict[str, str] = {}
        self._changed = anyio.Event()
        self._ids = itertools.count()
        self._created = time.monotonic()  # scale_log times count from here
        self._start = self._created  # lambda counts from the first item in (reset then)
        self._started = False
        self._last_done: float | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self.scale_log: list[tuple[float, str, int, str]] = []
        self._wanted_before: set[str] = set()
        self._finishing = False
        self._notified = 0.0  # when on_change was last called
        self._fatal: StageFailed | None = None  # a stage lost every replica and cannot get one

    # -- public -------------------------------------------------------------------------------

    def metrics(self) -> PipelineMetrics:
        """The figures so far."""
        counts = {"ok": 0, "pruned": 0, "dead": 0}
        for outcome in self._outcomes.values():
            if outcome in counts:  # not "kept": this run did not make it
                counts[outcome] += 1
        # Once every item has its outcome, time stops at the last one (not at shutdown).
        now = self._last_done if self._last_done is not None and self._finished() else time.monotonic()
        return pipeline_metrics(
            [s.meter for s in self.stages if s.meter],
            counts["ok"],
            counts["pruned"],
            counts["dead"],
            self._start,
            now,
        )

    @property
    def last_done(self) -> float | None:
        """When (``time.monotonic()``) an item last got its outcome; None before the first."""
        return self._last_done

    async def run(self) -> PipelineResult:
        """Start the replicas, run the start hooks, run every item to an outcome, run the
        finalize hooks, stop the replicas.

        Raises:
            StageFailed: a stage's start or finalize hook failed (nothing is lost: the
                items committed stay committed, and a rerun runs the hook again).
        """
        failed: StageFailed | None = None
        metrics: PipelineMetrics | None = None
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                for stage in self.stages:
                    for _ in range(stage.cfg.replicas):
                        self._spawn(stage)
                await self._wait_started()
                await self._start_hooks()
                tg.start_soon(self._scale_loop)
                tg.start_soon(self.source.run, self._changed_set)
                await self._dispatch_loop()
                for task_id, error in getattr(self.source, "dead", {}).items():  # dead-lettered by the master
                    self._outcomes[task_id] = "dead"
                    self._errors[task_id] = error
                metrics = self.metrics()  # the items' figures, before finalize's time
                self._finishing = True  # the scaler rests: finalize's replica must stay
                await self._finalize_hooks()
            except StageFailed as exc:  # raised below, not wrapped in the group's ExceptionGroup
                failed = exc
            tg.cancel_scope.cancel()
        await self._stop_all()  # cancelled (Ctrl-C), the node stops the workers itself
        if failed is not None:
            raise failed
        assert metrics is not None
        return PipelineResult(
            metrics,
            dict(self._outcomes),
            dict(self._errors),
            dict(self._outputs),
            dict(self._finals),
            tuple(self.scale_log),
            self.kept,
        )

    # -- hooks --------------------------------------------------------------------------------

    async def _wait_started(self) -> None:
        with anyio.fail_after(300):
            while any(s.starting for s in self.stages):  # every first replica up, or failed
                await self._changed.wait()
                self._changed = anyio.Event()
        if self._fatal is not None:
            raise self._fatal

    def _stage_run(self, stage: _Stage) -> dict[str, Any]:
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
                raise StageFailed(f"stage {stage.cfg.name}: start failed: {exc}") from exc
            committed = reply.get("committed", []) if isinstance(reply, dict) else []
            self._committed.update(str(t) for t in committed)
            log.info("stage_started", stage=stage.cfg.name, committed=len(committed))

    async def _finalize_hooks(self) -> None:
        """Each stage's ``finalize``, in stage order, once every item has its outcome."""
        for stage in self.stages:
            if "finalize" not in stage.hooks:
                continue
            if not stage.ready():  # the scaler gave back a drained stage's replicas
                self._spawn(stage)
                await self._wait_started()
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
                raise StageFailed(f"stage {stage.cfg.name}: finalize failed: {exc}") from exc
            finally:
                replica.busy -= 1
            self._finals[stage.cfg.name] = dict(summary) if isinstance(summary, dict) else {}

    # -- items --------------------------------------------------------------------------------

    def _changed_set(self) -> None:
        self._changed.set()

    def _source_left(self) -> bool:
        return not self.source.exhausted()

    def _settle(self, item: Item, outcome: str, error: str = "", tb: str = "") -> None:
        if outcome != "error":
            self._last_done = time.monotonic()
            self._outcomes[item.task_id] = outcome
            if error:
                self._errors[item.task_id] = error
        self.source.settle(item.task_id, outcome, error, tb)

    def _finished(self) -> bool:
        return not self._source_left() and all(
            not s.queue and all(r.busy == 0 for r in s.replicas) for s in self.stages
        )

    def _credit(self, stage: _Stage) -> int:
        """How many more items ``stage`` may take on without overfilling a downstream queue."""
        room = 1 << 30
        for d in self.config.downstream(stage.index):
            down = self.stages[d]
            inflight = sum(r.busy for r in stage.replicas)
            room = min(room, down.cfg.queue - len(down.queue) - inflight)
        return room

    async def _dispatch_loop(self) -> None:
        while not self._finished():
            if self._fatal is not None:
                raise self._fatal
            self._fill_source()
            for stage in reversed(self.stages):  # downstream first frees credit upstream
                self._dispatch(stage)
            self._notify()
            await self._changed.wait()
            self._changed = anyio.Event()

    def _fill_source(self) -> None:
        first = self.stages[0]
        now = time.monotonic()
        while room := first.cfg.queue - len(first.queue):
            taken = self.source.take(room)
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

    def _keep(self, task_id: str) -> None:
        """Its output is committed already: the item is done (invariant 8), nothing runs it."""
        self.kept += 1
        self._outcomes[task_id] = "kept"
        self.source.settle(task_id, "ok")
        log.info("item_kept", task_id=task_id)

    def _dispatch(self, stage: _Stage) -> None:
        # Round by round, so that every replica has a call before any has a second.
        for depth in range(stage.cfg.inflight):
            for replica in stage.ready():
                if replica.calls > depth or not stage.queue:
                    continue
                n = min(stage.cfg.batch, len(stage.queue), self._credit(stage))
                if n <= 0:
                    return
                self._send(stage, replica, [stage.queue.popleft() for _ in range(n)])

    def _send(self, stage: _Stage, replica: _Replica, batch: list[Item]) -> None:
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

    async def _call(self, stage: _Stage, replica: _Replica, batch: list[Item]) -> None:
        assert replica.ref is not None and stage.meter is not None
        t0 = time.monotonic()
        actor_s: float | None = None
        try:
            reply = await replica.ref.ask("process", {"items": [it.data for it in batch]}, timeout=600)
            results, actor_s = _outcomes(reply, len(batch), stage.cfg.name)
        except TroupeError as exc:  # the replica died, hung or answered nonsense: retry the items
            log.warning("stage_call_failed", stage=stage.cfg.name, replica=replica.name, error=str(exc))
            results = [{"error": f"{type(exc).__name__}: {exc}", "traceback": ""}] * len(batch)
            self._replace(stage, replica)
        now = time.monotonic()
        # The actor takes calls one at a time: this one's service began when the one before it
        # answered (or when it was sent, if the replica was idle). Time queued behind it is not
        # the stage's latency.
        begun = max(t0, replica.last_reply)
        replica.last_reply = now
        ok = pruned = errors = 0
        for item, result in zip(batch, results, strict=True):
            if "ok" in result:
                ok += 1
                self._forward(stage, item, result["ok"], now)
            elif "pruned" in result:
                pruned += 1
                self._settle(item, "pruned", str(result["pruned"]))
            else:
                errors += 1
                self._retry(stage, item, str(result.get("error")), str(result.get("traceback", "")))
        # A batch call handles its items together: the latency per item is amortised over them.
        n = len(batch)
        stage.meter.finished(
            ok, pruned, errors, (now - begun) / n, now, None if actor_s is None else actor_s / n
        )
        replica.busy -= n
        replica.calls -= 1
        self._changed.set()

    def _forward(self, stage: _Stage, item: Item, data: Any, now: float) -> None:
        downstream = self.config.downstream(stage.index)
        if not downstream:
            if self.keep_outputs:
                self._outputs[item.task_id] = data
            self._settle(item, "ok")
            return
        for d in downstream:
            down = self.stages[d]
            down.queue.append(Item(item.task_id, item.seed, data, 0))
            assert down.meter is not None
            down.meter.queued(len(down.queue), now)

    def _retry(self, stage: _Stage, item: Item, error: str, tb: str) -> None:
        if not self.source.retries_locally:  # the master decides: retry later, or dead letter
            log.warning("item_failed_to_master", stage=stage.cfg.name, task_id=item.task_id, error=error)
            self._settle(item, "error", error, tb)
            return
        item.attempt += 1
        if stage.index == 0 and isinstance(item.data, dict):  # the first stage is told the attempt
            item.data = {**item.data, "attempt": item.attempt}
        if item.attempt >= self.config.max_attempts:
            self._settle(item, "dead", error, tb)
            log.error("item_dead", stage=stage.cfg.name, task_id=item.task_id, error=error, traceback=tb)
            return
        log.warning(
            "item_retry", stage=stage.cfg.name, task_id=item.task_id, attempt=item.attempt, error=error
        )
        stage.queue.appendleft(item)

    def _notify(self) -> None:
        # A display needs no more than a few frames a second; the figures cost a snapshot of
        # every stage, which at hundreds of items a second is the engine's largest cost.
        if self.on_change is None:
            return
        now = time.monotonic()
        if now - self._notified >= self.on_change_every_s or self._finished():
            self._notified = now
            self.on_change(self.metrics())

    # -- replicas -----------------------------------------------------------------------------

    def _spawn(self, stage: _Stage) -> None:
        assert self._tg is not None
        stage.starting += 1
        name = f"{self.config.name}-{stage.cfg.name}-{next(self._ids)}"
        self._tg.start_soon(self._start_replica, stage, name)

    async def _start_replica(self, stage: _Stage, name: str) -> None:
        spec = {
            "name": name,
            "kind": stage.cfg.name,
            "actors": [{"name": "stage", "class": stage.cfg.actor, "kwargs": dict(stage.cfg.kwargs)}],
        }
        spawned = False
        try:
            # A worker that exits while starting (its class does not import) is answered at once.
            await self.runtime.control(
                self.node_endpoint, "spawn_worker", {**spec, "timeout_s": _START_S}, timeout=_START_S + 10
            )
            spawned = True
            ref = self.runtime.ref(f"{name}/stage")
            info = await ref.ask("stage_info", None, timeout=60)  # resolves and connects
            stage.hooks = tuple(str(h) for h in (info or {}).get("hooks", ()))
        except TroupeError as exc:
            stage.starting -= 1
            why = str(exc)
            if isinstance(exc, UnknownMessageType):
                why = f"{stage.cfg.actor} is not a StageActor ({exc})"
            log.error("replica_start_failed", stage=stage.cfg.name, replica=name, error=why)
            # Said before the stop below is awaited: no item may move while it runs.
            if not stage.ready() and not stage.starting:  # nothing left to run the stage's items
                self._fatal = StageFailed(f"stage {stage.cfg.name}: replica {name} could not start: {why}")
            self._changed.set()
            if spawned:  # its process runs but cannot serve the stage: stop it, it is no replica
                await self._stop_worker(name)
            return
        stage.starting -= 1
        stage.replicas.append(_Replica(name, ref))
        assert stage.meter is not None
        stage.meter.set_replicas(len(stage.ready()), time.monotonic())
        self.scale_log.append(
            (time.monotonic() - self._created, stage.cfg.name, len(stage.ready()), "started")
        )
        self._changed.set()

    def _replace(self, stage: _Stage, replica: _Replica) -> None:
        """A replica failed under a call: stop using it, stop its worker, start another."""
        assert self._tg is not None
        if replica.retiring:
            return
        self._mark_retiring(stage, replica)
        self._tg.start_soon(self._retire, stage, replica)
        self._spawn(stage)

    def _mark_retiring(self, stage: _Stage, replica: _Replica) -> None:
        replica.retiring = True  # from now on it is given no work
        assert stage.meter is not None
        stage.meter.set_replicas(len(stage.ready()), time.monotonic())

    async def _retire(self, stage: _Stage, replica: _Replica) -> None:
        with anyio.fail_after(600):
            while replica.busy:  # its last call is still running; it ends on its own
                await anyio.sleep(0.02)
        if replica in stage.replicas:
            stage.replicas.remove(replica)
        self.scale_log.append(
            (time.monotonic() - self._created, stage.cfg.name, len(stage.ready()), "retired")
        )
        await self._stop_worker(replica.name)
        self._changed.set()

    async def _scale_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.scale_interval_s)
            self._scale_once()

    def _drained(self, stage: _Stage) -> bool:
        up = self.config.upstream(stage.index)
        upstream_done = not self._source_left() if up is None else (self._drained(self.stages[up]))
        return upstream_done and not stage.queue and all(r.busy == 0 for r in stage.replicas)

    def _scale_once(self) -> None:
        assert self._tg is not None
        if self._finishing:
            return
        inputs = [
            ScaleInput(
                s.cfg.name,
                len(s.ready()),
                s.starting,
                s.cfg.min_replicas,
                s.cfg.most,
                len(s.queue),
                sum(r.busy for r in s.replicas),
                self._drained(s),
            )
            for s in self.stages
        ]
        decisions = decide_scaling(inputs, self.config.slot_budget)
        # Growing costs a process start (seconds of CPU for torch): only grow for a backlog
        # seen on two looks in a row. Giving back drained slots needs no such patience.
        wanted = {d.stage for d in decisions if d.delta > 0}
        confirmed = wanted & self._wanted_before
        self._wanted_before = wanted
        for decision in decisions:
            if decision.delta > 0 and decision.stage not in confirmed:
                continue
            stage = next(s for s in self.stages if s.cfg.name == decision.stage)
            log.info("stage_scaled", stage=decision.stage, delta=decision.delta, reason=decision.reason)
            if decision.delta > 0:
                for _ in range(decision.delta):
                    self._spawn(stage)
            else:
                idle = sorted(stage.ready(), key=lambda r: r.busy)[: -decision.delta]
                for replica in idle:
                    self._mark_retiring(stage, replica)
                    self._tg.start_soon(self._retire, stage, replica)

    async def _stop_all(self) -> None:
        # All at once: a replica's exit (a torch interpreter's teardown: seconds) need not wait
        # for the one before it.
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for stage in self.stages:
                    for replica in list(stage.replicas):
                        tg.start_soon(self._stop_worker, replica.name)
                    stage.replicas.clear()

    async def _stop_worker(self, name: str) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self.runtime.control(self.node_endpoint, "stop_worker", {"name": name}, timeout=30)
            except TroupeError as exc:
                log.warning("replica_stop_failed", replica=name, error=str(exc))


def _outcomes(reply: Any, n: int, stage: str) -> tuple[list[dict[str, Any]], float | None]:
    """The outcomes of a ``process`` call and the time it took inside the actor (if told)."""
    actor_s: float | None = None
    results = reply
    if isinstance(reply, dict):
        results = reply.get("outcomes")
        told = reply.get("actor_s")
        actor_s = float(told) if isinstance(told, (int, float)) and told >= 0 else None
    if not isinstance(results, list) or len(results) != n or not all(isinstance(r, dict) for r in results):
        size = len(results) if isinstance(results, list) else type(results).__name__
        raise TroupeError(f"stage {stage} answered {size} outcomes for {n} items")
    return results, actor_s
