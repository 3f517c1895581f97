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

The engine is built of parts, each a base class that holds one of these ideas over the engine's
state (set up here, in ``__init__``): the replicas (``replicas.py``), the hook calls
(``hook_calls.py``), the queues' filling and credits (``dispatch.py``), a call to a replica
(``replica_calls.py``), an item's outcome (``item_outcomes.py``), a lost holder's items
(``lost_holders.py``) and the held outputs' releases (``handle_ledger.py``). This module keeps
the run: its state, its loop, its figures and its result.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import JobCancelled, StageFailed
from troupe.runtime.owned_controls import OwnedControls
from troupe.runtime.owner_beat import OwnerBeat
from troupe.runtime.placement import Host

from .config import PipelineConfig
from .dispatch import ItemDispatch
from .first_output import FirstOutput
from .hook_calls import HookCalls
from .hosts import EngineHosts
from .model import (
    StageMeter,
    pipeline_metrics,
)
from .records import Item, Replica, StageState
from .result import PipelineMetrics, PipelineResult
from .source import ItemSource, LocalSource, SourceItem

__all__ = ["Item", "PipelineEngine"]


class PipelineEngine(HookCalls, ItemDispatch):
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
        on_finishing: called once every item has ended, as the finalize hooks start, where
            each of them has a replica already: the run starts no more replicas but to replace
            one lost now (its own node retires its template then, ``Node.retire_template``).
        on_making: awaited once, before the run first hands an item to a stage that ends the
            pipeline or calls its first ``finalize`` hook: from then on it may have made
            something in ``out`` (``first_output.py``); the run records its troupe code there.
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
        on_finishing: Callable[[], None] | None = None,
        on_making: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self.on_event = on_event
        self.on_finalized = on_finalized
        self.on_finishing = on_finishing
        self._first_output = FirstOutput(on_making)
        self._wire: list[int] | None = None  # the bytes counted through the engine (run)
        self.nodes_outlive_run = nodes_outlive_run
        self.hosts = hosts or EngineHosts([Host.anything("local", node_endpoint)])
        self._direct = config.data_plane == "direct"
        self._keys = itertools.count()
        self._releases: dict[str, tuple[Replica, list[str]]] = {}  # holder name -> keys to release
        self.placement: dict[str, str] = {}
        self.restarted = 0
        self._asking = 0  # items whose stage that commits outputs is asked about them
        self._restarts: dict[str, int] = {}
        self._branches: dict[str, int] = {}  # items passed to several stages: branches going
        self._branch_ends: dict[str, tuple[str, str, str]] = {}
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
        self.made_nothing = False  # every item died or was pruned, no output anywhere (finalize)
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
            made_nothing=self.made_nothing,
            remade=len(self.remade),
        )

    async def _run_items(self) -> tuple[StageFailed | JobCancelled | None, PipelineMetrics | None]:
        """Everything ``run`` does but the replicas' stop: a start or finalize hook's failure,
        and the items' figures (None when it failed first)."""
        failed: StageFailed | JobCancelled | None = None
        metrics: PipelineMetrics | None = None
        # A stop that comes once the items' group is done with its body, while it waits for
        # the background stops of replicas with no finalize hook (shielded), ends those waits
        # as a stop inside the body does: each would wait out its 30 s otherwise.
        async with anyio.create_task_group() as watching:
            watching.start_soon(self._end_stop_waits_if_stopped)
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
                    # No finalize hook needs a replica started for it (its stage's were given back).
                    if self.on_finishing is not None and all(
                        s.ready() for s in self.stages if "finalize" in s.hooks
                    ):
                        self.on_finishing()
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
            watching.cancel_scope.cancel()
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

    def _changed_set(self) -> None:
        self._changed.set()

    def _finished(self) -> bool:
        return (
            not self._remakes
            and not self._asking
            and self.source.exhausted()
            and all(not s.queue and all(r.busy == 0 for r in s.replicas) for s in self.stages)
        )

    async def _dispatch_loop(self) -> None:
        while True:
            halted = self.source.halted()  # before the finish: a halted source has no more items
            if halted is not None:
                raise JobCancelled(halted)
            if self._finished():
                self._notify()  # every item's outcome shown before finalize, however throttled
                return
            if self._fatal is not None:
                raise self._fatal
            self._fill_source()
            for stage in reversed(self.stages):  # downstream first frees credit upstream
                self._dispatch(stage)
            self._notify()
            await self._changed.wait()
            self._changed = anyio.Event()

    def _notify(self) -> None:
        # A display needs no more than a few frames a second; the figures cost a snapshot of
        # every stage, which at hundreds of items a second is the engine's largest cost.
        if self.on_change is None:
            return
        now = time.monotonic()
        if now - self._notified >= self.on_change_every_s or self._finished():
            self._notified = now
            self.on_change(self.metrics())
