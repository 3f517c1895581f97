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
- the meters behind the throughput model (``pipeline_model``);
- where each replica runs (``hosts``): the node of a one-node run, or the live nodes of a
  cluster, by the stage's resources; a node that dies takes its replicas with it, and their
  items run again elsewhere;
- the data plane (``handoff``): by default a stage's outputs stay with the replica that made
  them and the next stage's replica pulls them from there, so the engine moves ids, sizes and
  outcomes, not frames. An item whose held payload is lost with its replica runs again from
  the first stage.

Items are dicts. The first stage receives ``{"task_id", "seed", "attempt"}`` (the try: from 1
for an item of a master's job, whose attempts the master counts, as under ``troupe run``; from 0
from a source of its own); every stage's
``ok`` output is the next stage's input. An item pruned by a stage is counted and never passed
on; an item whose stage call errs is retried there up to ``max_attempts``, then dead. An item
whose output is already there (``done``: committed by an earlier, interrupted run) is kept as
it is: settled ok at once, no stage runs it again. A stage's ``start`` hook may name such items;
an item that earlier runs ended ok whose output such a list lacks (deleted since) is made again,
outside the source's count (its record says done; the output is the truth).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import structlog

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import JobCancelled, PeerLost, ProtocolError, StageFailed, TroupeError, Unreachable
from troupe.runtime.placement import Host
from troupe.runtime.tasks.jobspec import generated_task_id

from .config import PipelineConfig
from .hosts import EngineHosts
from .model import (
    StageMeter,
    pipeline_metrics,
)
from .owned_controls import OwnedControls
from .owner_beat import OwnerBeat
from .records import Handle, Item, Replica, StageState
from .replicas import ReplicaPool
from .result import PipelineMetrics, PipelineResult
from .source import ItemSource, LocalSource, SourceItem
from .stage import StageRun

__all__ = ["Item", "PipelineEngine"]

log = structlog.get_logger(__name__)

_CALL_S = 600.0  # how long one call to a replica may take before its items are retried


class PipelineEngine(ReplicaPool):
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
        hosts: the nodes the replicas may run on (default: the node at ``node_endpoint``).
        nodes_outlive_run: the nodes are not stopped with the run (a cluster's, a running
            node's): a cancelled run stops its replicas there itself. False when the caller
            stops the run's own node right after (it stops its workers; asked, a node whose
            task group is being cancelled would not answer).
        on_event: called with a line for people when the run waits on something (a replica
            whose start failed in a way that may pass, tried again).
        on_finalized: called with the run's result as soon as every finalize hook has
            returned, before the replicas are stopped: the moment the run's outputs are
            complete, which its record keeps (``run_dir.mark_complete``) so that a stop that
            lands after it (the replicas' or the node's stop) does not lose it.
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
        hosts: EngineHosts | None = None,
        nodes_outlive_run: bool = True,
        on_event: Callable[[str], None] | None = None,
        on_finalized: Callable[[PipelineResult], None] | None = None,
    ) -> None:
        self.config = config
        self.on_event = on_event
        self.on_finalized = on_finalized
        self._wire: list[int] | None = None  # the bytes counted through the engine (run)
        self.nodes_outlive_run = nodes_outlive_run
        self.hosts = hosts or EngineHosts([Host.anything("local", node_endpoint)])
        self._direct = config.data_plane == "direct"
        self._keys = itertools.count()
        self._releases: dict[str, tuple[Replica, list[str]]] = {}  # holder name -> keys to release
        self.placement: dict[str, str] = {}
        self.restarted = 0
        self._restarts: dict[str, int] = {}
        self.done = done
        self.keep_outputs = keep_outputs
        self.out = out
        self.fresh = fresh
        self.on_change_every_s = on_change_every_s
        self._committed: set[str] = set()  # named by stages' start hooks
        self._outputs_listed = False  # a start hook named every committed output (even none)
        self._remakes: deque[SourceItem] = deque()  # ended ok before, output gone: made again
        self.remade: set[str] = set()
        self._outputs: dict[str, Any] = {}
        self._finals: dict[str, dict[str, Any]] = {}
        self.kept = 0  # items whose output an earlier run committed
        self.runtime = runtime
        self.node_endpoint = node_endpoint
        self.on_change = on_change
        self.stages = [
            StageState(i, s, meter=StageMeter(s.name, s.queue)) for i, s in enumerate(config.stages)
        ]
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
        self._launched: dict[str, Host] = {}  # every worker this run started and has not stopped
        self._controls = OwnedControls(runtime)
        self._stop_waits: set[anyio.CancelScope] = set()
        self._suspects: dict[Replica, float] = {}
        self._look_now = anyio.Event()
        self._notified = 0.0  # when on_change was last called
        self._fatal: StageFailed | None = None  # a stage lost every replica and cannot get one
        self.owner_beat: OwnerBeat | None = None  # a cluster run's beat to the master (_run_items)

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
            JobCancelled: the source's job was cancelled at the master mid-run; the replicas
                are stopped, and nothing is finalised.
        """
        self._wire = self._count_wire_bytes()
        try:
            failed, metrics = await self._run_items()
        except BaseException:
            # Cancelled (Ctrl-C) or failed: nodes that stay up would keep the replicas running.
            if self.nodes_outlive_run:
                await self._stop_all(cancelled=True)
            await self.source.release()  # a rerun leases the items held now at once
            raise
        await self._stop_all()
        if failed is not None:
            await self.source.release()  # a rerun leases the items held now at once
            raise failed
        assert metrics is not None
        return self._result(metrics)

    def _result(self, metrics: PipelineMetrics) -> PipelineResult:
        return PipelineResult(
            metrics,
            dict(self._outcomes),
            dict(self._errors),
            dict(self._outputs),
            dict(self._finals),
            tuple(self.scale_log),
            self.kept,
            placement=dict(self.placement),
            engine_bytes=0 if self._wire is None else sum(self._wire),
            restarted=self.restarted,
            remade=len(self.remade),
        )

    async def _run_items(self) -> tuple[StageFailed | JobCancelled | None, PipelineMetrics | None]:
        """Everything ``run`` does but the replicas' stop: a start or finalize hook's failure,
        and the items' figures (None when it failed first)."""
        failed: StageFailed | JobCancelled | None = None
        metrics: PipelineMetrics | None = None
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                tg.start_soon(self.hosts.watch)
                tg.start_soon(self._node_loop)
                tg.start_soon(self._worker_loop)
                if self.nodes_outlive_run and self.hosts.master is not None:
                    worker_id = getattr(self.source, "worker_id", None)
                    self.owner_beat = OwnerBeat(self.runtime, self.hosts.master, worker_id)
                    await self.owner_beat.beat()
                    tg.start_soon(self.owner_beat.run)
                for stage in self.stages:
                    for _ in range(stage.cfg.replicas):
                        self._spawn(stage)
                await self._wait_started()
                await self._start_hooks()
                await self._find_lost_outputs()
                tg.start_soon(self._scale_loop)
                tg.start_soon(self.source.run, self._changed_set)
                await self._dispatch_loop()
                dead = getattr(self.source, "dead", {})
                for task_id, error in dead.items():  # dead-lettered by the master
                    self._outcomes[task_id] = "dead"
                    self._errors[task_id] = error
                if dead:  # the last of them died just now: the run's items ended here, not before
                    self._last_done = time.monotonic()
                metrics = self.metrics()  # the items' figures, before finalize's time
                self._flush_releases()
                self._finishing = True  # the scaler rests: finalize's replica must stay
                self._stop_unhooked()
                await self._finalize_hooks()
                if self.on_finalized is not None:  # no await since the last hook returned
                    self.on_finalized(self._result(metrics))
            except (StageFailed, JobCancelled) as exc:  # raised as it is, not in an ExceptionGroup
                failed = exc
            except BaseException:
                # Stopped (Ctrl-C) or failed: the stops asked of nodes need no answer now, or
                # this group would wait for each (30 s) from a node this run has stopped.
                self._stop_waits_end()
                raise
            tg.cancel_scope.cancel()
        return failed, metrics

    def _count_wire_bytes(self) -> list[int] | None:
        """Start counting the bytes the engine's runtime sends and receives (what passes
        through the engine's process); None where its transport cannot count."""
        transport = getattr(self.runtime, "transport", None)
        if transport is None or not hasattr(transport, "wire_bytes"):
            return None
        transport.wire_bytes = [0, 0]
        counted: list[int] = transport.wire_bytes
        return counted

    # -- hooks --------------------------------------------------------------------------------

    async def _wait_started(self) -> None:
        with anyio.fail_after(300):
            while any(s.starting for s in self.stages):  # every first replica up, or failed
                await self._changed.wait()
                self._changed = anyio.Event()
        if self._fatal is not None:
            raise self._fatal

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
                raise StageFailed(f"stage {stage.cfg.name}: start failed: {exc}") from exc
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

    def _settle(self, item: Item, outcome: str, error: str = "", tb: str = "") -> None:
        if outcome != "error":
            self._last_done = time.monotonic()
            self._outcomes[item.task_id] = outcome
            if error:
                self._errors[item.task_id] = error
        self.source.settle(item.task_id, outcome, error, tb)

    def _finished(self) -> bool:
        return (
            not self._remakes
            and self.source.exhausted()
            and all(not s.queue and all(r.busy == 0 for r in s.replicas) for s in self.stages)
        )

    def _credit(self, stage: StageState) -> int:
        """How many more items ``stage`` may take on without overfilling a downstream queue."""
        room = 1 << 30
        for d in self.config.downstream(stage.index):
            down = self.stages[d]
            inflight = sum(r.busy for r in stage.replicas)
            room = min(room, down.cfg.queue - len(down.queue) - inflight)
        return room

    async def _dispatch_loop(self) -> None:
        while True:
            halted = self.source.halted()  # before the finish: a halted source has no more items
            if halted is not None:
                raise JobCancelled(halted)
            if self._finished():
                return
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

    def _keep(self, task_id: str) -> None:
        """Its output is committed already: the item is done (invariant 8), nothing runs it."""
        self.kept += 1
        self._outcomes[task_id] = "kept"
        self.source.settle(task_id, "ok")
        log.info("item_kept", task_id=task_id)

    def _dispatch(self, stage: StageState) -> None:
        # Round by round, so that every replica has a call before any has a second.
        for depth in range(stage.cfg.inflight):
            for replica in stage.ready():
                if replica.calls > depth or not stage.queue:
                    continue
                n = min(stage.cfg.batch, len(stage.queue), self._credit(stage))
                if n <= 0:
                    return
                batch = self._take(stage, n)
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

    def _request(self, stage: StageState, batch: list[Item]) -> tuple[str, dict[str, Any]]:
        """The call for ``batch``: ``process`` with the items inline, or, on the direct data
        plane, ``process_direct`` naming where held inputs are and asking to hold outputs."""
        if not self._direct:
            return "process", {"items": [it.data for it in batch]}
        items: list[Any] = []
        sources: list[list[str] | None] = []
        for it in batch:
            if isinstance(it.data, Handle):
                items.append(None)
                holder = it.data.holder
                sources.append(
                    [holder.outbox, it.data.key, *([holder.outbox_at] if holder.outbox_at else [])]
                )
            else:
                items.append(it.data)
                sources.append(None)
        payload: dict[str, Any] = {"items": items}
        if any(sources):
            payload["from"] = sources
        if self.config.downstream(stage.index):
            payload["hold"] = [f"{it.task_id}/{stage.cfg.name}/{next(self._keys)}" for it in batch]
            payload["inline_below"] = self.config.inline_below
        return ("process_direct" if len(payload) > 1 else "process"), payload

    async def _call(self, stage: StageState, replica: Replica, batch: list[Item]) -> None:
        assert replica.ref is not None and stage.meter is not None
        if replica.gone_why:  # given up between its dispatch and now: nothing was sent to it
            self._waited_behind(stage, replica, batch)
            return
        t0 = time.monotonic()
        actor_s: float | None = None
        failure: TroupeError | None = None
        msg_type, payload = self._request(stage, batch)
        with anyio.CancelScope() as scope:  # cancelled when the replica's node dies
            replica.scopes.append(scope)
            try:
                reply = await replica.ref.ask(msg_type, payload, timeout=_CALL_S)
                results, actor_s = _outcomes(reply, len(batch), stage.cfg.name)
            except PeerLost as exc:
                failure = exc
                # Its process went. The engine's watch of its node, asked now, says why (killed
                # as hung, say) and gives up its calls together, telling the one it was working
                # on from those that only waited behind it: until then, this call waits.
                self.suspect(replica)
                await anyio.sleep(max(0.0, t0 + _CALL_S - time.monotonic()))
            except TroupeError as exc:
                failure = exc
            finally:
                replica.scopes.remove(scope)
        if scope.cancelled_caught:
            if replica.working_on is not None and replica.working_on is not scope:
                self._waited_behind(stage, replica, batch)
                return
            failure = Unreachable(f"replica {replica.name}: {replica.gone_why or 'gone'}")
        if failure is not None:  # the replica died, hung or answered nonsense: retry the items
            log.warning("stage_call_failed", stage=stage.cfg.name, replica=replica.name, error=str(failure))
            results = [{"error": f"{type(failure).__name__}: {failure}", "traceback": ""}] * len(batch)
            if not isinstance(failure, ProtocolError):  # a reply it made that cannot travel: it is well
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
                self._consumed(item)
                self._forward(stage, item, result["ok"], now)
            elif "held" in result and not replica.lost:
                ok += 1
                self._consumed(item)
                replica.held += 1
                self._forward(
                    stage, item, Handle(replica, str(result["held"]), _int(result.get("bytes"))), now
                )
            elif "pruned" in result:
                pruned += 1
                self._consumed(item)
                self._settle(item, "pruned", str(result["pruned"]))
            elif "lost" in result or "held" in result:  # its input, or its output, is gone
                errors += 1
                if "lost" in result:
                    self._holder_gone(item)
                self._restart(item, str(result.get("lost", f"replica {replica.name} is gone")))
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
        self._flush_releases()
        self._changed.set()

    def _waited_behind(self, stage: StageState, replica: Replica, batch: list[Item]) -> None:
        """A lost replica's call that only waited in its mailbox behind the one it was working
        on: its items go back to the stage's queue with no attempt counted (a hung item took
        the innocent ones behind it down with it, attempt after attempt)."""
        log.info(
            "stage_call_requeued",
            stage=stage.cfg.name,
            replica=replica.name,
            task_ids=[item.task_id for item in batch],
            why=replica.gone_why,
        )
        for item in reversed(batch):
            stage.queue.appendleft(item)
        assert stage.meter is not None
        stage.meter.queued(len(stage.queue), time.monotonic())
        replica.busy -= len(batch)
        replica.calls -= 1
        self._changed.set()

    def _forward(self, stage: StageState, item: Item, data: Any, now: float) -> None:
        downstream = self.config.downstream(stage.index)
        if not downstream:
            if self.keep_outputs:
                self._outputs[item.task_id] = data
            self._settle(item, "ok")
            return
        if isinstance(data, Handle):
            data.refs = len(downstream)
        for d in downstream:
            down = self.stages[d]
            down.queue.append(Item(item.task_id, item.seed, data, 0))
            assert down.meter is not None
            down.meter.queued(len(down.queue), now)

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

    def _retry(self, stage: StageState, item: Item, error: str, tb: str) -> None:
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
        again (an attempt, so that a run that keeps losing nodes still ends)."""
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

    def _notify(self) -> None:
        # A display needs no more than a few frames a second; the figures cost a snapshot of
        # every stage, which at hundreds of items a second is the engine's largest cost.
        if self.on_change is None:
            return
        now = time.monotonic()
        if now - self._notified >= self.on_change_every_s or self._finished():
            self._notified = now
            self.on_change(self.metrics())


def _int(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


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
