"""``troupe run``: a pipeline run to the end on a one-host cluster, with progress per stage.

The work is :func:`troupe.runtime.pipeline.runner.run_pipeline`'s (the public API); this module
shows its progress, its metrics table and its summary, or the metrics as one JSON object.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from troupe import template_prestart
from troupe.actors.datagen.config import default_pipeline
from troupe.cli.client import fail
from troupe.cli.literal import literal, markup
from troupe.cli.log_filters import visible
from troupe.cli.stop_signals import lines_above, say_aside, say_if_heard, stop_came
from troupe.cli.tables import print_whole
from troupe.runtime.pipeline.config import PipelineConfig, load_pipeline
from troupe.runtime.pipeline.result import PipelineMetrics, PipelineResult
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.pipeline.run_fingerprint import fingerprint
from troupe.runtime.pipeline.run_outcome import completed_run
from troupe.runtime.pipeline.runner import RunStart, run_pipeline
from troupe.runtime.process_start import age_s

from .moved_endpoint import say_moved
from .starting_status import StartingStatus

__all__ = [
    "Cluster",
    "command_split",
    "dead_lines",
    "declared_config",
    "finish_run",
    "metrics_json",
    "metrics_table",
]

console = Console()


def metrics_table(m: PipelineMetrics) -> Table:
    """The stage metrics and the throughput model, as a table (times per item in ms)."""
    table = Table(
        title=literal(f"stages (bottleneck: {m.bottleneck or '-'})"),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        padding=(0, 1),
    )
    table.add_column("stage", no_wrap=True)
    # errors: the failed attempts (raised, or the replica lost), retried while an item has
    # attempts left (max_attempts): an item's last one, which killed it, is among them.
    for col in ("in", "out", "pruned", "errors", "l_s ms", "actor ms", "N_s", "mu_s/s", "queue max", "busy"):
        table.add_column(col, justify="right", no_wrap=True)
    for s in m.stages:
        table.add_row(
            literal(s.name),
            str(s.items_in),
            str(s.items_out),
            str(s.failed),
            str(s.errors),
            f"{s.latency_s * 1000:.1f}",
            f"{s.actor_latency_s * 1000:.1f}",
            f"{s.concurrency:.2f}",
            f"{s.throughput:.1f}",
            f"{s.queue_max}/{s.queue_bound}",
            f"{s.busy_fraction:.0%}",
        )
    return table


def command_split(result: PipelineResult) -> dict[str, float]:
    """The whole command's wall time, from its process's start (its own imports and checks,
    which come before ``run_pipeline``'s clock starts) to now, and the share of it outside the
    run's steady state: ``command_s``, ``command_startup_share``. Empty where it cannot be read."""
    age = age_s()
    if age is None or age <= 0:
        return {}
    return {"command_s": age, "command_startup_share": max(age - result.steady_s, 0.0) / age}


def metrics_json(result: PipelineResult) -> dict[str, Any]:
    """The run's figures as one JSON object (``troupe run --json``)."""
    m = result.metrics
    return {
        "already_complete": result.already_complete,
        "made_nothing": result.made_nothing,
        "lambda": m.lambda_measured,
        "lambda_theory": m.lambda_theory,
        "lambda_succ": m.lambda_succ,
        "efficiency": m.efficiency,
        "bottleneck": m.bottleneck,
        "elapsed_s": m.elapsed_s,
        "wall_s": result.wall_s,
        "startup_s": result.startup_s,
        "steady_s": result.steady_s,
        "finalize_s": result.finalize_s,
        "startup_share": result.startup_share,
        **command_split(result),
        "items": result.counts(),
        "job_items": result.ended or None,
        "placement": result.placement,
        "engine_bytes": result.engine_bytes,
        "engine_bytes_per_item": result.engine_bytes_per_item,
        "restarted": result.restarted,
        "remade": result.remade,
        "stages": {
            s.name: {
                "l_s": s.latency_s,
                "N_s": s.concurrency,
                "mu_s": s.throughput,
                "busy": s.busy_fraction,
                "engine_s_per_item": s.latency_s,
                "actor_s_per_item": s.actor_latency_s,
                "items_in": s.items_in,
                "items_out": s.items_out,
                "pruned": s.failed,
                "errors": s.errors,
                "queue_max": s.queue_max,
                "queue_bound": s.queue_bound,
                "replicas": s.replicas,
            }
            for s in m.stages
        },
        "errors": result.errors,
        "finals": result.finals,
        "scale_log": [list(entry) for entry in result.scale_log],
    }


def declared_config(config: Path | None, items: int | None) -> PipelineConfig:
    """The pipeline as declared (``{out}`` not resolved): a file, or the embedded default."""
    return load_pipeline(config, items=items) if config else default_pipeline(items=items)


def finish_run(
    config: Path | None,
    out: Path,
    items: int | None,
    endpoint: str,
    master_endpoint: str,
    fresh: bool = False,
    as_json: bool = False,
    cluster: Cluster | None = None,
    defaults: bool = False,
    moved: str | None = None,
    retry_dead: bool = False,
    metrics: str | None = None,
    master_default: bool = False,
) -> None:
    """The body of ``troupe run``: run what is missing in --out, finalise, report. ``defaults``:
    the endpoints are defaults found free, which may give way to free ports if taken meanwhile
    (``master_default``: the master's is, where --endpoint was given);
    ``moved``: the line that says the defaults were taken, said once the run starts (a run
    refused before, a stage's bad kwarg, says its error alone); ``retry_dead``: an earlier
    run's dead items run again (``--retry-dead``); ``metrics``: where the run serves its
    Prometheus metrics (``--metrics``)."""
    from troupe.cli.client import run_async

    run_async(
        _finish_run,
        config,
        out,
        items,
        endpoint,
        master_endpoint,
        fresh,
        as_json,
        cluster,
        defaults,
        moved,
        retry_dead,
        metrics,
        master_default,
        done_if_returned=True,  # a stop that came once the run had finished: its report, exit 0
    )


@dataclass(frozen=True)
class Cluster:
    """``troupe run --cluster``: the running master whose nodes run the replicas."""

    master: str
    nodes: int = 0
    keys: Path | None = None
    endpoint: str | None = None  # where the run's mailbox listens (--endpoint)


async def _finish_run(
    config: Path | None,
    out: Path,
    items: int | None,
    endpoint: str,
    master_endpoint: str,
    fresh: bool,
    as_json: bool,
    cluster: Cluster | None,
    defaults: bool = False,
    moved: str | None = None,
    retry_dead: bool = False,
    metrics: str | None = None,
    master_default: bool = False,
) -> None:
    """The run and its report. It returns only where the run finished: a stop signal that came
    after its finalisation (its record says complete) ends it with the dataset's lines."""
    declared = declared_config(config, items)
    if cluster is None:  # on a cluster, the master's journal is the run's state, not --out's
        RunDir(out).check(fingerprint(declared), fresh)
    # The run logs to --out/logs itself once its checks pass (the stage classes, in the
    # template it starts first; on a cluster, the master's job and the stages' placement): a
    # refused run leaves --out as it was.
    progress = Progress(
        TextColumn("{task.description:>8}", markup=False),  # stage names: text
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}", markup=False),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    )
    bars = {s.name: progress.add_task(s.name, total=declared.items, note="") for s in declared.stages}
    before = 0
    # Until the cluster is up: seconds of imports (torch's, on a slow disk tens of them).
    starting = StartingStatus(console, cluster is not None, as_json)

    run_started = False

    def started(start: RunStart) -> None:
        nonlocal before, run_started
        starting.stop()
        before, run_started = start.before, True
        if moved is not None:  # on stderr: stdout may carry --json
            say_moved(moved)
        if as_json:
            return
        if start.job_cancelled:
            # A one-host run's job is its own journal's: --fresh starts it anew; a cluster's is not.
            anew = "--fresh starts anew" if cluster is None else "a new job needs another \\[pipeline] name"
            console.print(
                "the master's job was cancelled (`troupe ctl cancel`): nothing more runs; "
                f"finalising what earlier runs committed ({anew})",
                soft_wrap=True,
            )
            return
        if start.before >= start.items:
            console.print(_all_ended_line(start), soft_wrap=True)
            return
        again = f" ({start.before} done before)" if start.before else ""
        up = "cluster joined" if cluster is not None else "node up"
        at = f" at {start.node_endpoint}" if start.node_endpoint else ""  # for `ctl status --node`
        console.print(
            literal(
                f"{up} in {start.startup_s:.2f} s{at}; running {_count(start.items, 'item')}{again} "
                f"through {_count(start.stages, 'stage')} into {out}"
            ),
            soft_wrap=True,
        )
        progress.start()

    shown: PipelineMetrics | None = None  # the last progress shown: what a stopped run says

    def show(m: PipelineMetrics, ended: int | None = None) -> None:
        """The bars at ``m``; ``ended``: the run finished, having ended that many items."""
        nonlocal shown
        shown = m
        for s in m.stages:
            # A retried item passes a stage again: its bar counts items, not attempts. Those dead
            # (here or upstream) or pruned upstream never pass it: once the run ended, every bar
            # reaches the items ended (a finished run's stopped at its ok and pruned ones).
            done = s.items_out + s.failed if ended is None else ended
            progress.update(
                bars[s.name],
                completed=min(declared.items, before + done),
                note=f"q {s.queue_depth}/{s.queue_bound} x{s.replicas}",
            )

    def told(line: str) -> None:
        if as_json:  # stdout is the JSON object's
            Console(stderr=True).print(literal(line), soft_wrap=True)
        else:
            progress.console.print(literal(line), soft_wrap=True)

    stopped_after_it = False  # a stop signal came once the run had finished
    with lines_above(console):  # a stop's lines above the spinner and the bars, not over them
        starting.start()
        try:
            result = await run_pipeline(
                config or declared,  # its path: an error about a stage names the file
                out,
                items=items if config else None,
                fresh=fresh,
                retry_dead=retry_dead,
                keep_outputs=False,
                on_progress=show,
                on_start=started,
                on_event=told,
                node_endpoint=None if cluster is not None else endpoint,
                master_endpoint=None if cluster is not None else master_endpoint,
                cluster=None if cluster is None else cluster.master,
                nodes=0 if cluster is None else cluster.nodes,
                keys=None if cluster is None else cluster.keys,
                mailbox=None if cluster is None else cluster.endpoint,
                endpoints_may_move=defaults,
                master_may_move=master_default,
                on_importing=starting.importing,
                template_ahead=template_prestart.take(),  # troupe.cli.entry started it
                # A mixed cluster (runtime/pipeline/mixed_code.py): on stderr, --json or not.
                on_warning=lambda line: say_aside(markup("[yellow]warning:[/] ", literal(line))),
                metrics=metrics,
            )
            if progress.live.is_started:
                show(result.metrics, sum(result.counts().values()))  # where the table below starts
            # A stop that came once the finalize hooks had returned stopped nothing (the run
            # returned): what is said is the run's record, written then, as a rerun says it.
            finished = completed_run(out) if stop_came() else None
            if finished is not None:
                result, stopped_after_it = finished, True
        except anyio.get_cancelled_exc_class():  # a stop signal: the run stopped what it started
            with contextlib.suppress(OSError):  # the terminal hung up (SIGHUP): nothing to redraw
                if progress.live.is_started:
                    progress.stop()
            # With --json too (stdout, the JSON's, stays empty): the stop is said.
            said = stopped_line(shown, before, declared.items, out) if run_started else STOPPED_BEFORE
            say_if_heard(Console(stderr=True), literal(said))
            raise
        finally:
            starting.stop()  # transient: a run refused before it started prints only its error
            if progress.live.is_started:  # a run refused before it started printed nothing: keep it so
                progress.stop()
    if as_json:
        print(json.dumps(metrics_json(result), indent=2))
    elif result.already_complete:
        done = "; ".join(_finals(result)) or "every item has its outcome"
        lead = "complete when the stop came" if stopped_after_it else "already complete"
        console.print(literal(f"{lead}: {done}"), soft_wrap=True)
        dead, ended = result.ended.get("dead", 0), sum(result.ended.values())
        if dead and not result.made_nothing:  # which says it below
            log = out / "logs" / "local.jsonl"
            said = f"{dead} of its {ended} items died (their errors: {log}); {RETRY_DEAD_HINT}"
            console.print(literal(said), soft_wrap=True)
    else:
        if result.outcomes or result.kept:
            _report(result, before, out)
        for line in _finals(result):
            console.print(literal(line), soft_wrap=True)
    if result.made_nothing:
        raise fail(_made_nothing_line(result, out), 1)


def _all_ended_line(start: RunStart) -> str:
    """What a run whose every item an earlier run ended says as it starts. Dead ones are said
    as such, not as done: every item dead is a run that made nothing (said last, with the way
    out), where it read "every item was done" and then failed finalising nothing."""
    dead = start.dead_before
    if dead >= start.items:
        return f"every item died in an earlier run ({dead} of {start.items}): nothing to finalise"
    # The stages' start hooks may yet find an output gone (deleted since): that item is made
    # again, and said so, before the stages finalise.
    died = f" ({dead} of them dead: {RETRY_DEAD_HINT})" if dead else ""
    return f"every item was done by an earlier run{died}; checking their outputs, then finalising"


def _made_nothing_line(result: PipelineResult, out: Path) -> str:
    """The error of a run that made nothing (its own, or found so by a rerun): how many items
    died and were pruned, where the tracebacks are, and the way out: ``--retry-dead`` for dead
    ones (a plain rerun never said it: it told ``--fresh``), another config for pruned ones (a
    stage prunes the same items again; it said "no committed episodes" from the writer)."""
    log = out / "logs" / "local.jsonl"
    ended = result.ended or result.counts()
    dead, pruned = ended.get("dead", 0), ended.get("pruned", 0)
    if not pruned:
        head = (
            f"already complete, but every item died there ({dead}): nothing was made"
            if result.already_complete
            else f"every item died ({dead}): the run made nothing"
        )
        fix = f"fix what killed them (their tracebacks: {log}), then run the same command with --retry-dead"
        return f"{head}; {fix}"
    ends = f"{pruned} pruned" + (f", {dead} dead" if dead else "")
    head = (
        f"already complete, but no item made an output there ({ends}): nothing was made"
        if result.already_complete
        else f"no item made an output ({ends}): the run made nothing"
    )
    reasons = [why for task, why in sorted(result.errors.items()) if result.outcomes.get(task) == "pruned"]
    why = f" (the first: {reasons[0]})" if reasons else ""
    killed = f"; the dead ones' tracebacks: {log}" if dead else ""
    return (
        f"{head}; a stage pruned them{why}, and would again: change what prunes them (the "
        f"stage's kwargs, the seeds), then run it again into the same --out{killed}"
    )


def _count(n: int, noun: str) -> str:
    """``1 item``, ``6 items``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


RETRY_DEAD_HINT = "the same command with --retry-dead runs the dead items again, their cause fixed"
"""The way out of a run with dead items (a full disk, a bug since fixed): a plain rerun leaves them dead."""

STOPPED_BEFORE = (
    "stopped before the run started (its node was starting): no item ran; the same command starts it"
)
"""What a run stopped before its node was up says last: it said "stopping gracefully" and then
nothing, as if the stop had hung."""


def stopped_line(shown: PipelineMetrics | None, before: int, items: int, out: Path) -> str:
    """What a run stopped by a signal says last: how far it got (at least: an item may have
    ended after the last progress it showed) and how to go on."""
    done = before + (shown.items_done if shown is not None else 0)
    if done >= items:  # the items had all ended: the stop came during the finalisation
        return (
            f"stopped while finalising: all {items} items were done; what they committed stays in "
            f"{out}, and the same command run again finalises"
        )
    if done == 0:  # "at least 0" read as nothing made, though a stage may have committed one
        return (
            f"stopped before any item's end was recorded ({items} items); what the stages committed "
            f"stays in {out}, and the same command run again goes on from there"
        )
    return (
        f"stopped: at least {done} of {items} items done; what they committed stays in {out}, "
        "and the same command run again goes on from there"
    )


def _finals(result: PipelineResult) -> list[str]:
    """What each stage's finalize said, as lines."""
    lines = []
    for stage, summary in result.finals.items():
        text = summary.get("summary") if isinstance(summary, dict) else None
        lines.append(str(text) if text else f"{stage}: finalised")
    return lines


def _report(result: PipelineResult, before: int, out: Path) -> None:
    """The stage table and the run's lines; ``before``: items the run record had as done."""
    m = result.metrics
    # Items of this run plus those done earlier add up to the pipeline's items: an interrupted
    # run's record misses those committed after its last journal write (the stages kept them).
    print_whole(console, metrics_table(m), unwrapped=True)
    console.print(
        f"lambda {m.lambda_measured:.2f} items/s, lambda_theory {m.lambda_theory:.2f}, "
        f"lambda_succ {m.lambda_succ:.2f}; efficiency {m.efficiency:.2f}; "
        f"{m.items_ok} ok, {m.items_pruned} pruned, {m.items_dead} dead in {m.elapsed_s:.1f} s"
        + result.earlier_runs(before),
        soft_wrap=True,
    )
    console.print(
        f"wall {result.wall_s:.1f} s: start-up {result.startup_s:.1f} s, steady {result.steady_s:.1f} s, "
        f"finalisation {result.finalize_s:.1f} s; start-up share {result.startup_share:.0%}"
        + (
            f" (the whole command {split['command_s']:.1f} s, {split['command_startup_share']:.0%} "
            "of it outside the steady state)"
            if (split := command_split(result))
            else ""
        ),
        soft_wrap=True,
    )
    for line in dead_lines(result, out / "logs" / "local.jsonl"):
        console.print(literal(line), soft_wrap=True)
    if m.items_dead and not result.made_nothing:  # which says its own way out
        console.print(literal(RETRY_DEAD_HINT), soft_wrap=True)
    nodes = sorted(set(result.placement.values()))
    if len(nodes) > 1 or result.restarted:
        console.print(
            literal(
                f"replicas on {len(nodes)} nodes ({', '.join(nodes)}); "
                f"{result.engine_bytes_per_item / 1024:.1f} KiB through the engine per item"
                + (
                    f"; {result.restarted} items restarted (their holder was lost)"
                    if result.restarted
                    else ""
                )
            ),
            soft_wrap=True,
        )


def dead_lines(result: PipelineResult, log: Path, groups: int = 3, ids: int = 3) -> list[str]:
    """The dead items' errors, the same error once with the items it killed: the ``groups``
    most frequent errors, ``ids`` task ids each; then where every item's error is kept (the
    run's ``log`` has their tracebacks)."""
    by_error: dict[str, list[str]] = {}
    for task_id, outcome in sorted(result.outcomes.items()):
        if outcome == "dead":
            # A remote error's text is the user's code's: a terminal's escape codes are written out.
            error = visible(result.errors.get(task_id) or "no error recorded")
            by_error.setdefault(error, []).append(task_id)
    if not by_error:
        return []
    lines = []
    ranked = sorted(by_error.items(), key=lambda kv: -len(kv[1]))
    for error, task_ids in ranked[:groups]:
        more = f" and {len(task_ids) - ids} more" if len(task_ids) > ids else ""
        lines.append(f"dead {len(task_ids)}: {error} ({', '.join(task_ids[:ids])}{more})")
    if len(ranked) > groups:
        others = len(ranked) - groups
        lines.append(f"dead: {others} other error{'s' if others > 1 else ''}")
    lines.append(f"every item's error: --json (its errors); their tracebacks: {log}")
    return lines
