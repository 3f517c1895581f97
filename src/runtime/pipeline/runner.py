"""Run a pipeline from Python: the API behind ``troupe run``.

::

    from troupe import run_pipeline_sync

    result = run_pipeline_sync("stages.toml", out="out", items=100)
    print(result.metrics.lambda_measured, result.counts(), result.outputs)

Where the replicas run:

- by default on a one-host cluster started in this process and stopped at the end: a node on
  a free loopback port, whose worker processes are the stages' replicas;
- ``node=ENDPOINT``: on that running node (``troupe node start``), which starts and stops the
  replicas as the engine asks;
- ``cluster=MASTER``: on the live nodes of the running master's cluster (``troupe node start
  --master MASTER`` on each host), placed by the stages' resources (``hosts``); the items are
  the master's job named like the pipeline (resumable as any job), and no node or master is
  started here. ``nodes=N`` waits until N nodes are alive first.

Where the items come from:

- with an ``out`` directory and no ``master``: a master started here whose journal is
  ``out/.troupe/journal.db``. The run owns ``out`` (``run_dir``'s rules): a rerun with the
  same pipeline resumes (what an earlier run ended stays ended; what its stages committed is
  kept), another pipeline is refused, ``fresh=True`` starts anew, and a finished run is
  answered at once with ``already_complete`` (where ``out`` cannot be written, a read-only
  archive, from its record alone: ``RunDir.answer_read_only``);
- ``master=ENDPOINT`` (or ``cluster=``): a running master; the items are the job named like
  the pipeline, submitted unless the master has it, and leased as a worker leases tasks. An
  ``out`` records the pipeline, and the job once a run of it finished there: a rerun of that
  job (its items all ended on the master) is answered at once with ``already_complete``;
- with neither: the config's seed range, in memory.

``metrics=HOST:PORT`` serves the run's Prometheus metrics there (docs/METRICS.md): a node
started here serves its own and the pipeline's; on running nodes (``cluster=``, ``node=``) this
process serves the pipeline's (``run_metrics``).

This module drives a run; its parts are apart: ``run_plan`` (what is checked and prepared before
anything starts), ``run_cluster`` (the node, master or cluster the run starts or joins, and
stops), ``run_metrics`` (its metrics endpoint), ``run_outcome`` (a finished run's answer, the
job's items, the wall-time split) and ``run_exit`` (how a stop after the finalize hooks, or a
lone error, reaches the caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from troupe.runtime.core.loading import check_stage_actors_async
from troupe.runtime.errors import ConfigError, StageFailed
from troupe.runtime.logs import run_log
from troupe.runtime.transports.loopback import moved_line

from .config import PipelineConfig
from .early_template import OnImporting, early_template
from .engine import PipelineEngine
from .resource_notes import warn_of_resources
from .result import PipelineMetrics, PipelineResult
from .run_cluster import LOCAL_NODE, on_cluster, on_node
from .run_dir import RunDir
from .run_exit import kept_once_finalized, lone_error_raised
from .run_fingerprint import fingerprint
from .run_metrics import check_run_metrics, run_endpoint
from .run_outcome import already_complete, job_items, with_split
from .run_plan import check_early, make_log_dir, plan_run, refuse_inside_an_import
from .source import MasterSource
from .user_callbacks import callbacks_guarded

if TYPE_CHECKING:
    from troupe.template_prestart import Prestarted

__all__ = ["RunStart", "run_pipeline", "run_pipeline_sync"]


@dataclass(frozen=True, slots=True)
class RunStart:
    """What ``on_start`` is told once the cluster is up, before the first item moves.

    Attributes:
        startup_s: seconds from the call to a running cluster.
        items: the pipeline's items.
        before: items an earlier run into the same ``out`` had ended already.
        stages: the number of stages.
        out: the output directory, or None.
        job_cancelled: the master's job was cancelled before this run (``troupe ctl cancel``):
            nothing more runs, and the run finalises what earlier runs committed.
        node_endpoint: where the node the run started listens (None on running nodes): what
            ``troupe ctl status --node`` is given to watch the run.
        dead_before: of ``before``, the items earlier runs left dead (their attempts used up):
            a plain rerun leaves them so (``retry_dead`` runs them again).
    """

    startup_s: float
    items: int
    before: int
    stages: int
    out: Path | None
    job_cancelled: bool = False
    node_endpoint: str | None = None
    dead_before: int = 0


@callbacks_guarded
async def run_pipeline(
    pipeline: PipelineConfig | str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    items: int | None = None,
    node: str | None = None,
    master: str | None = None,
    fresh: bool = False,
    retry_dead: bool = False,
    keep_outputs: bool = True,
    on_progress: Callable[[PipelineMetrics], None] | None = None,
    on_start: Callable[[RunStart], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    node_endpoint: str | None = None,
    master_endpoint: str | None = None,
    cluster: str | None = None,
    nodes: int = 0,
    keys: str | os.PathLike[str] | None = None,
    mailbox: str | None = None,
    endpoints_may_move: bool = False,
    master_may_move: bool = False,
    template_ahead: Prestarted | None = None,
    on_importing: OnImporting | None = None,
    on_warning: Callable[[str], None] | None = None,
    metrics: str | None = None,
) -> PipelineResult:
    """Run ``pipeline`` to the end and return its metrics, outcomes and outputs.

    Args:
        pipeline: a :class:`PipelineConfig`, or the path of a pipeline TOML file.
        out: the run's output directory: ``{out}`` in stage kwargs, the logs, and (without
            ``master``) the journal that makes a rerun resume. None: no directory.
        items: overrides the pipeline's ``items``.
        node: a running node's endpoint to start the replicas on (default: a node started
            in this process).
        master: a running master's endpoint to take the items from as a job.
        fresh: start anew in ``out``: delete what troupe wrote there (and the stages' ``start``
            hooks drop their outputs) instead of resuming.
        retry_dead: the items an earlier run left dead (their attempts used up: a full disk, a
            bug since fixed) run again, their attempts counted anew; the others are resumed as
            always. Not with ``fresh``, which runs every item again anyway.
        keep_outputs: keep the last stage's output of every ok item in ``result.outputs``.
        on_progress: called with fresh metrics whenever items move.
        on_start: called once the cluster is up (:class:`RunStart`).
        on_event: called with a line for people when something the run waits on changes: the
            master stops answering (the run waits for it), and answers again; and as the run
            starts, where what ``out`` holds was made by other troupe code (``run_code``).
        node_endpoint: where the node started here listens (default: a free loopback port).
        master_endpoint: where the master started here listens (default: a free loopback port).
        cluster: a running master whose live nodes run the replicas (see the module docstring).
        nodes: with ``cluster``, wait (up to a minute) until this many nodes are alive.
        keys: with ``cluster``, the CURVE keys directory the cluster takes.
        mailbox: with ``cluster``, where this process's mailbox listens, which the master calls
            (a cancel): default this host's address towards the master, loopback where the
            master is on this host or the keys hold no cluster pair (``run_keys.py``).
        endpoints_may_move: ``node_endpoint`` and ``master_endpoint`` are defaults found free
            before the run: one taken since (another run started at once) gives way to a free
            port of its host, said through ``on_event``, rather than failing the run.
        master_may_move: ``master_endpoint`` alone is such a default (``node_endpoint`` was
            given, and stays as given): taken since, it gives way to a free port likewise.
        template_ahead: a node template the caller started ahead (``troupe.template_prestart``,
            as ``troupe run`` does at its entry): a one-host run's node takes it over; a run on a
            cluster has it check the stage classes, then stops it (started with
            ``check_only``, it imports no more than the check needs); any other run stops it.
            The wall time still counts from this call.
        on_importing: told about every second, while a one-host run's node template imports
            the stage classes (before ``on_start``), the class or module it imports now (None
            once done, or before it said) and the seconds since it started: a slow or hanging
            import is named while the run waits.
        on_warning: called before the run starts with a line for people, once for each of:
            with ``cluster``, the master or a live node runs other troupe code than this process
            or than each other (``mixed_code.py``): who runs what; the keys hold no cluster pair,
            so the master cannot reach the run and a cancel waits for a renewal (``run_keys.py``);
            on the run's own node, a stage asks a GPU where torch sees no CUDA device, or more
            CPUs than the host has (``resource_notes.py``): the run goes on, on the CPU.
        metrics: ``HOST:PORT`` of a Prometheus endpoint for the run's life (docs/METRICS.md):
            the node started here serves its families and the pipeline's; with ``cluster`` or
            ``node``, this process serves the pipeline's, labelled ``pipeline``. On loopback,
            or (with ``cluster``) off it with the cluster's keys.

    Returns:
        The run's :class:`PipelineResult`; also where the run was stopped (cancelled) once its
        finalize hooks had returned, as its processes stopped: its outputs were complete.

    Raises:
        ConfigError: the pipeline is invalid, uses ``{out}`` without ``out``, or ``out`` was
            made with another pipeline (or by someone else); ``cluster`` with ``node`` or
            ``master``; fewer than ``nodes`` nodes alive; ``metrics`` is not ``HOST:PORT``,
            is off loopback without keys, or cannot be bound.
        StageFailed: a stage's ``start`` or ``finalize`` hook failed.
        BaseException: what a callback (``on_progress``, ``on_start``, ``on_event``,
            ``on_importing``, ``on_warning``) raised, as itself: the first one stops the run as
            Ctrl-C does (the replicas stopped, what the stages committed kept for a rerun).
    """
    t0 = time.perf_counter()
    m0 = time.monotonic()  # the wall-time split's marks (the engine's clock)
    refuse_inside_an_import()
    if cluster is not None and (node is not None or master is not None):
        raise ConfigError(
            "cluster= runs on the cluster's own nodes and master: give it without node= or master="
        )
    items_from = master or cluster  # a master's job: then ``out`` holds no run record
    own_node = node is None and cluster is None
    check_run_metrics(metrics, keys, own_node)
    async with contextlib.AsyncExitStack() as stack:
        ahead = [template_ahead] if template_ahead is not None else []
        stack.callback(_discard_all, ahead)  # whatever happens before a node takes it over
        early = await anyio.to_thread.run_sync(
            check_early, pipeline, out, items, items_from, fresh, retry_dead
        )
        if early.answer is not None:  # a finished run in a folder it cannot write: nothing to do
            return already_complete(early.answer)
        # On running nodes, this process serves the pipeline's figures; bound now, a port in
        # use stops the run before it starts anything (a node started here binds its own).
        hand_figures = await stack.enter_async_context(
            run_endpoint(None if own_node else metrics, early.cfg.name)
        )
        # The run's lines go to its log file (in a program's process, troupe's, beside the
        # program's logging); those before the checks are held, as nothing is made in ``out`` yet.
        held = stack.enter_context(run_log(LOCAL_NODE, "run"))
        # A one-host run starts its node's template first: it checks the stage classes while
        # it imports them for the replicas (early_template.py); a finished run needs neither.
        template = None
        if node is None and cluster is None and not early.finished:
            taken = ahead.pop() if ahead else None
            template = await stack.enter_async_context(
                early_template(early.cfg, LOCAL_NODE, early.source, taken, on_importing)
            )
        elif cluster is not None or (node is not None and not early.finished):
            # On a cluster's nodes, or a running node's (``node=``, a test's troupe_cluster): the
            # classes installed here are checked here as well, their kwargs included, before
            # anything is submitted or made in ``out`` (a misspelt class had made the master's
            # job, then failed on a node; a missing kwarg failed each replica as it started).
            # One whose module is only on the nodes' hosts is theirs (their import path).
            # A template the command started ahead checks them as it imports (forking nothing).
            taken = ahead.pop() if ahead else None
            if taken is not None:
                async with early_template(
                    early.cfg, LOCAL_NODE, early.source, taken, on_importing, installed_only=True
                ):
                    pass
            else:
                await check_stage_actors_async(early.cfg, early.source, installed_only=True)
        plan = await anyio.to_thread.run_sync(plan_run, early.cfg, out, items_from, fresh, retry_dead)
        cfg, resolved, out_dir, run_dir = plan.cfg, plan.resolved, plan.out, plan.run_dir
        if run_dir is not None:  # held since its checks: freed here unless its master took it over
            stack.callback(run_dir.release)
        if run_dir is not None and run_dir.adopted and on_event is not None:
            on_event(
                f"{run_dir.out} held a run that made nothing, and no record of what it was made "
                "with: it is taken for this command's pipeline (--fresh starts anew)"
            )
        if run_dir is not None and run_dir.recovered and on_event is not None:
            on_event(
                f"{run_dir.record_path} was {run_dir.recovered}: rebuilt from {run_dir.copy_path.name} "
                "beside it, which records this command's pipeline; what was committed there is "
                "kept, and its outputs are checked and finalised again"
            )
        if run_dir is not None and run_dir.other_code and on_event is not None:
            on_event(run_dir.other_code)
        log_dir = plan.log_dir
        if cluster is None:  # on a cluster: once the master took the run (below)
            make_log_dir(log_dir)
            if held is not None:
                held.write_to(log_dir)
        if plan.complete is not None:
            return already_complete(plan.complete)
        if own_node:  # there, a stage's resources place nothing: a need it lacks is said
            warn_of_resources(cfg, on_warning)
        failed: StageFailed | None = None
        result: PipelineResult | None = None
        done: list[PipelineResult] = []  # the run's result once its finalize hooks returned
        where = (
            on_cluster(
                resolved, cluster, nodes, keys, fresh, out_dir, on_event, on_warning, retry_dead, mailbox
            )
            if cluster is not None
            else on_node(
                resolved,
                run_dir,
                log_dir,
                node,
                master,
                node_endpoint,
                master_endpoint,
                template,
                fresh,
                out_dir,
                endpoints_may_move,
                on_event,
                retry_dead,
                metrics,
                master_may_move,
            )
        )
        shared_dir = RunDir(out_dir) if out_dir is not None and items_from is not None else None
        adopting = [run_dir] if run_dir is not None and run_dir.adopted else []
        # Nothing ran until the body: a failed start (the job was made with other items) leaves
        # the adopted folder without the record this run wrote, else it binds the wrong items.
        stack.callback(_unadopt, adopting)
        async with kept_once_finalized(done), lone_error_raised(), where as running:
            adopting.clear()
            made = running.source.made if isinstance(running.source, MasterSource) else None
            if shared_dir is not None:
                shared = await anyio.to_thread.run_sync(shared_dir.take_shared, fingerprint(cfg))
                stack.callback(shared.release)
            if held is not None and cluster is not None:
                held.write_to(log_dir)
            if shared_dir is not None:
                # The master's job had every item ended, and a run of that very job finished
                # here: answered as a one-host run's record answers, nothing started.
                ended = running.before >= cfg.items
                complete = (
                    await anyio.to_thread.run_sync(shared_dir.completed_job, made)
                    if made is not None and ended
                    else None
                )
                if complete is not None:
                    return already_complete(complete)
                await anyio.to_thread.run_sync(shared_dir.forget_complete)
                other_code = await anyio.to_thread.run_sync(shared_dir.check_code)
                if other_code is not None and on_event is not None:
                    on_event(other_code)
            node_moved = node_endpoint is not None and running.node_endpoint != node_endpoint
            own_master = running.master_endpoint
            master_moved = master_endpoint is not None and own_master not in (None, master_endpoint)
            if on_event is not None and (node_moved or master_moved):
                on_event(moved_line(node_endpoint, running.node_endpoint, master_endpoint, own_master))
            if on_event is not None and (cluster is not None or node is not None):
                for stage in (s for s in cfg.stages if s.progress_timeout_s is not None):
                    on_event(
                        f"stage {stage.name}: progress_timeout_s applies to a run's own node; the "
                        f"nodes of this run decide with their [supervision.kinds.{stage.name}]"
                    )
            if on_event is not None and isinstance(running.source, MasterSource):
                running.source.on_event = on_event
            if on_start is not None:
                up = time.perf_counter() - t0
                cancelled = isinstance(running.source, MasterSource) and running.source.cancelled_before
                own = running.node_endpoint if running.node is not None else None
                dead = len(getattr(running.source, "dead_before", ()))
                on_start(
                    RunStart(up, cfg.items, running.before, len(cfg.stages), out_dir, cancelled, own, dead)
                )
            engine_created = time.monotonic()

            def finished(outcome: PipelineResult) -> PipelineResult:
                """``outcome`` with what the job's record adds: its items by how they ended
                (every run's)."""
                return replace(
                    outcome,
                    ended=(job_items(running.book, cfg.name) if running.book is not None else None) or {},
                )

            def finalized(outcome: PipelineResult) -> None:
                # The outputs are complete now: recorded at once, so that a stop landing after
                # this (as the replicas and the node stop) leaves a run a rerun finds complete,
                # and kept for the return such a stop no longer prevents.
                outcome = finished(outcome)
                if run_dir is not None:
                    run_dir.mark_complete(outcome.finals, outcome.made_nothing, outcome.ended)
                elif shared_dir is not None:  # the job is the master's: the record names it
                    shared_dir.mark_complete(outcome.finals, outcome.made_nothing, outcome.ended, made)
                done.append(outcome)

            recorded_in = run_dir if run_dir is not None else shared_dir  # out's record, if any
            engine = PipelineEngine(
                resolved,
                running.runtime,
                running.node_endpoint,
                on_change=on_progress,
                source=running.source,
                keep_outputs=keep_outputs,
                out=None if out_dir is None else str(out_dir),
                fresh=fresh,
                hosts=running.hosts,
                nodes_outlive_run=running.node is None,  # a node started here stops its workers
                on_event=on_event,
                on_finalized=finalized,
                # Its exit (torch's pages) goes on during the finalize hooks, not after them.
                on_finishing=running.node.retire_template if running.node is not None else None,
                on_making=None if recorded_in is None else _noting_code(recorded_in),
            )
            hand_figures(lambda: pipeline_status(engine))
            if running.node is not None:
                running.node.status_extras["pipeline"] = lambda: pipeline_status(engine)
                if out_dir is not None:  # whose run it is, beside the node's user
                    out_shown = str(out_dir)
                    running.node.status_extras["out"] = lambda: out_shown
            try:
                result = finished(await engine.run())
            except StageFailed as exc:  # raised below, not wrapped in the cluster's ExceptionGroup
                failed = exc
        if failed is not None:
            raise failed
        if result is None and done:  # stopped once the finalize hooks had returned: complete
            result = done[0]
        if result is None:
            # Stopped (Ctrl-C in run_pipeline_sync: asyncio cancels the run's task), and a task
            # group on the way out took the cancellation for its own: the stop goes on up, as
            # KeyboardInterrupt from run_pipeline_sync, not as an UnboundLocalError.
            raise anyio.get_cancelled_exc_class()("the pipeline run was stopped before it ended")
        return with_split(result, m0, engine_created, engine.last_done, time.monotonic())


def run_pipeline_sync(
    pipeline: PipelineConfig | str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> PipelineResult:
    """:func:`run_pipeline` from synchronous code (its own event loop: uvloop when installed).

    Raises:
        RuntimeError: called where an event loop runs already (an ``async def``, Jupyter):
            ``await run_pipeline(...)`` there.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # none: this call runs its own
    else:
        raise RuntimeError(
            "run_pipeline_sync was called where an event loop already runs (an async function, "
            "Jupyter): use `await run_pipeline(...)` there"
        )

    async def main() -> PipelineResult:
        return await run_pipeline(pipeline, out, **kwargs)

    try:
        import uvloop  # noqa: F401

        options: dict[str, Any] = {"use_uvloop": True}
    except ImportError:
        options = {}
    return anyio.run(main, backend="asyncio", backend_options=options)


def pipeline_status(engine: PipelineEngine) -> dict[str, Any]:
    """The live stage metrics, for the node's status reply (``troupe ctl status``)."""
    from dataclasses import asdict

    m = engine.metrics()
    return {**asdict(m), "efficiency": m.efficiency, "replicas": engine.replica_status()}


def _noting_code(folder: RunDir) -> Callable[[], Awaitable[None]]:
    """The engine's ``on_making`` for a run whose ``out`` holds its record: this process's troupe
    code recorded there (``RunDir.note_code``), off the event loop."""

    async def note() -> None:
        await anyio.to_thread.run_sync(folder.note_code)

    return note


def _unadopt(adopting: list[RunDir]) -> None:
    for run_dir in adopting:
        run_dir.unadopt()


def _discard_all(unused: list[Prestarted]) -> None:
    for ahead in unused:
        ahead.discard()
