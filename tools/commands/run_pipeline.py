"""``troupe run``: a one-host cluster that runs a pipeline to the end, with progress per stage.

A rerun into the same ``--out`` resumes (``run_dir``): committed episodes are kept, the job in
the journal goes on, and the dataset is finalised once over every committed episode.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from troupe.actors.datagen.config import default_pipeline, resolve_out
from troupe.actors.lerobot.finalize import DatasetConfig
from troupe.cli.local_node import start_local_node
from troupe.runtime.core.client import connect
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.node.node import Node
from troupe.runtime.pipeline.config import PipelineConfig, load_pipeline
from troupe.runtime.pipeline.engine import PipelineEngine, PipelineResult
from troupe.runtime.pipeline.model import PipelineMetrics
from troupe.runtime.pipeline.source import MasterSource
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.master.master import Master, MasterConfig, open_journal
from troupe.runtime.tasks.output_store import OutputStore
from troupe.runtime.tasks.state import FINAL_STATES, JobState

from .run_dir import RunDir, fingerprint

__all__ = ["metrics_table", "run_pipeline"]

console = Console()


def metrics_table(m: PipelineMetrics) -> Table:
    """The stage metrics and the throughput model, as a table."""
    table = Table(title=f"stages (bottleneck: {m.bottleneck or '-'})")
    for col in (
        "stage",
        "in",
        "out",
        "failed",
        "errors",
        "l_s (s)",
        "N_s",
        "mu_s (/s)",
        "queue max/bound",
        "busy",
    ):
        table.add_column(col, justify="right")
    for s in m.stages:
        table.add_row(
            s.name,
            str(s.items_in),
            str(s.items_out),
            str(s.failed),
            str(s.errors),
            f"{s.latency_s:.3f}",
            f"{s.concurrency:.2f}",
            f"{s.throughput:.2f}",
            f"{s.queue_max}/{s.queue_bound}",
            f"{s.busy_fraction:.0%}",
        )
    return table


def load_config(config: Path | None, items: int | None, out: Path) -> PipelineConfig:
    """The pipeline to run: a file, or the embedded default; ``{out}`` resolved."""
    return resolve_out(declared_config(config, items), out.resolve())


def declared_config(config: Path | None, items: int | None) -> PipelineConfig:
    """The pipeline as declared (``{out}`` not resolved): a file, or the embedded default."""
    return load_pipeline(config, items=items) if config else default_pipeline(items=items)


async def run_pipeline(
    cfg: PipelineConfig,
    out: Path,
    endpoint: str,
    quiet: bool = False,
    master_endpoint: str | None = None,
    done: Callable[[str], bool] | None = None,
) -> PipelineResult:
    """Run ``cfg`` on a one-host cluster started in this process, and stop it again.

    With ``master_endpoint``, a master runs here too (its journal under ``out/.troupe``), the
    items are a job submitted to it, and the pipeline leases them like a worker; without, the
    items are the config's seed range. The job's id is the pipeline's name, so a rerun into
    the same ``out`` goes on with the job of its journal: done items stay done, the ones that
    were leased when the last run stopped are leased again. ``done`` says whether an item's
    output is committed already; such items are kept, not computed again.

    Cancelled (Ctrl-C), it stops the node (workers first, within its ``stop_grace_s``), then
    the master, then closes the journal.
    """
    out.mkdir(parents=True, exist_ok=True)
    log_dir = out / "logs"
    configure_logging("local", "run", log_dir, console=False)
    node_cfg = NodeConfig(
        name="local", endpoint=endpoint, log_dir=log_dir, stop_grace_s=10, master=master_endpoint
    )
    progress = Progress(
        TextColumn("{task.description:>8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
    )
    bars = {s.name: progress.add_task(s.name, total=cfg.items, note="") for s in cfg.stages}
    journal: Journal | None = None
    engine: PipelineEngine | None = None
    before = 0  # items the journal holds as ended: an earlier run finished them

    def show(m: PipelineMetrics) -> None:
        kept = before + (engine.kept if engine is not None else 0)
        for s in m.stages:
            progress.update(
                bars[s.name],
                completed=kept + s.items_out + s.failed,
                note=f"q {s.queue_depth}/{s.queue_bound} x{s.replicas}",
            )

    try:
        async with anyio.create_task_group() as tg:
            node: Node | None = None
            master: Master | None = None
            try:
                t0 = time.perf_counter()
                if master_endpoint:
                    (out / ".troupe").mkdir(exist_ok=True)
                    journal, book = open_journal(out / ".troupe" / "journal.db", new=True)
                    before = _ended_tasks(book, cfg.name)
                    master = Master(
                        MasterConfig(endpoint=master_endpoint, name="local-master"), journal, book
                    )
                    await _start_master(tg, master)
                node = await start_local_node(tg, node_cfg)
                if not quiet:
                    again = f" ({before} done before)" if before else ""
                    console.print(
                        f"node up in {time.perf_counter() - t0:.2f} s; running {cfg.items} items{again} "
                        f"through {len(cfg.stages)} stages into {escape(str(out))}"
                    )
                async with connect(endpoint, "local") as rt:
                    source = await _master_source(rt, master_endpoint, cfg, book) if master_endpoint else None
                    engine = PipelineEngine(cfg, rt, endpoint, on_change=show, source=source, done=done)
                    node.status_extras["pipeline"] = lambda: _pipeline_status(engine)
                    with progress:
                        result = await engine.run()
                        show(result.metrics)
            finally:  # done, failed or cancelled: stop and reap every worker, then the master
                with anyio.CancelScope(shield=True):
                    if node is not None:
                        node.stopping.set()
                        with anyio.move_on_after(node_cfg.stop_grace_s + 30):
                            await node.stopped.wait()
                    if master is not None:
                        master.stop()
    finally:
        if journal is not None:
            journal.close()
    return result


def _ended_tasks(book: TaskBook, job_id: str) -> int:
    job = next((j for j in book.jobs() if j.job_id == job_id), None)
    return 0 if job is None else sum(n for state, n in job.counts.items() if state in FINAL_STATES)


async def _start_master(tg: anyio.abc.TaskGroup, master: Master) -> None:
    async def serve() -> None:
        with anyio.CancelScope(shield=True):  # it outlives the node's stop; master.stop() ends it
            await master.run()

    tg.start_soon(serve)
    with anyio.fail_after(30):
        await master.ready.wait()


async def _master_source(rt: Any, master_endpoint: str, cfg: PipelineConfig, book: TaskBook) -> MasterSource:
    """Submit the pipeline's items as a job, unless the journal has it, and lease them."""
    job_id = cfg.name
    if all(j.job_id != job_id for j in book.jobs()):
        job = {
            "job": {
                "name": cfg.name,
                "kind": cfg.name,
                "count": cfg.items,
                "seed_start": cfg.seed_start,
                "max_attempts": cfg.max_attempts,
                "lease_s": 120,
                "backoff_base_s": 0.2,
                "backoff_max_s": 5.0,
                "speculation": {"enabled": False},
            }
        }
        await rt.control(master_endpoint, "submit", {"job": job, "source": "troupe run", "job_id": job_id})
    first = cfg.stages[0]
    return MasterSource(rt, master_endpoint, job_id, slots=first.queue + first.most * first.batch)


def _pipeline_status(engine: PipelineEngine) -> dict[str, Any]:
    """The live stage metrics, for the node's status reply (`troupe ctl status`)."""
    from dataclasses import asdict

    m = engine.metrics()
    return {**asdict(m), "efficiency": m.efficiency}


def finish_run(
    config: Path | None,
    out: Path,
    items: int | None,
    endpoint: str,
    master_endpoint: str,
    fresh: bool = False,
) -> None:
    """The body of ``troupe run``: check or start --out, run what is missing, finalise, report."""
    from troupe.cli.client import run_async

    run_async(_finish_run, config, out, items, endpoint, master_endpoint, fresh)


async def _finish_run(
    config: Path | None, out: Path, items: int | None, endpoint: str, master_endpoint: str, fresh: bool
) -> None:
    from troupe.actors.lerobot.finalize import finalize_dataset

    declared = declared_config(config, items)
    cfg = resolve_out(declared, out.resolve())
    store_root = _store_root(cfg)
    run_dir = RunDir(out)
    complete = run_dir.prepare(fingerprint(declared), fresh, [store_root] if store_root else [])
    store = OutputStore(store_root) if store_root else None
    configure_logging("local", "run", out / "logs", console=False)
    if complete is not None and _still_complete(run_dir, complete, store):
        console.print(f"already complete: {complete['episodes']} episodes at {escape(str(out.resolve()))}")
        return
    if _job_ended(run_dir, cfg.name):
        console.print("every item was done by an earlier run; finalising the dataset")
    else:
        if store is not None:
            store.sweep_staging()  # what writers killed mid-episode left; none runs now
        result = await run_pipeline(
            cfg, out, endpoint, False, master_endpoint, done=store.is_committed if store else None
        )
        _report(result)
    if store is None:
        return
    summary = await anyio.to_thread.run_sync(finalize_dataset, store, out, _dataset_config(cfg))
    run_dir.mark_complete(summary.total_episodes, summary.total_frames)
    console.print(
        f"dataset: {summary.total_episodes} episodes, {summary.total_frames} frames, "
        f"LeRobot v3.0 at {escape(str(out.resolve()))}"
    )


def _report(result: PipelineResult) -> None:
    m = result.metrics
    kept = sum(1 for outcome in result.outcomes.values() if outcome == "kept")
    console.print(metrics_table(m))
    console.print(
        f"lambda {m.lambda_measured:.2f} items/s, lambda_theory {m.lambda_theory:.2f}, "
        f"lambda_succ {m.lambda_succ:.2f}; efficiency {m.efficiency:.2f}; "
        f"{m.items_ok} ok, {m.items_pruned} pruned, {m.items_dead} dead in {m.elapsed_s:.1f} s"
        + (f"; {kept} committed before, kept" if kept else "")
    )


def _store_root(cfg: PipelineConfig) -> Path | None:
    """Where the pipeline commits its episodes: the OutputStore a stage's ``store`` kwarg names."""
    root = next((s.kwargs["store"] for s in cfg.stages if "store" in s.kwargs), None)
    return None if root is None else Path(root)


def _dataset_config(cfg: PipelineConfig) -> DatasetConfig:
    fps = next((int(s.kwargs.get("fps", 10)) for s in cfg.stages if "fps" in s.kwargs), 10)
    return DatasetConfig(fps=fps, robot_type="troupe_nav_camera")


def _still_complete(run_dir: RunDir, complete: dict[str, Any], store: OutputStore | None) -> bool:
    """The finished run's dataset is still there and covers every committed episode."""
    episodes = complete.get("episodes")
    if store is not None and len(store.committed()) != episodes:
        return False
    return run_dir.dataset_episodes() == episodes


def _job_ended(run_dir: RunDir, job_id: str) -> bool:
    """The journal holds the job as ended: nothing is left to run, only to finalise."""
    if not run_dir.journal_path.exists():
        return False
    journal, book = open_journal(run_dir.journal_path)
    try:
        job = next((j for j in book.jobs() if j.job_id == job_id), None)
    finally:
        journal.close()
    return job is not None and job.state is not JobState.RUNNING
