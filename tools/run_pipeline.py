"""``troupe run``: a one-host cluster that runs a pipeline to the end, with progress per stage."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from troupe.actors.datagen_config import default_pipeline, resolve_out
from troupe.runtime.client import connect
from troupe.runtime.config import NodeConfig
from troupe.runtime.logs import configure_logging
from troupe.runtime.master import Master, MasterConfig, open_journal
from troupe.runtime.pipeline import PipelineEngine, PipelineResult
from troupe.runtime.pipeline_config import PipelineConfig, load_pipeline
from troupe.runtime.pipeline_model import PipelineMetrics
from troupe.runtime.pipeline_source import MasterSource

from .run_cmd import start_local_node

__all__ = ["metrics_table", "run_pipeline"]

console = Console()


def metrics_table(m: PipelineMetrics) -> Table:
    """The stage metrics and the throughput model, as a table."""
    table = Table(title=f"stages (bottleneck: {m.bottleneck or '-'})")
    for col in ("stage", "in", "out", "failed", "errors", "l_s (s)", "N_s", "mu_s (/s)", "queue max/bound", "busy"):
        table.add_column(col, justify="right")
    for s in m.stages:
        table.add_row(s.name, str(s.items_in), str(s.items_out), str(s.failed), str(s.errors),
                      f"{s.latency_s:.3f}", f"{s.concurrency:.2f}", f"{s.throughput:.2f}",
                      f"{s.queue_max}/{s.queue_bound}", f"{s.busy_fraction:.0%}")
    return table


def load_config(config: Path | None, items: int | None, out: Path) -> PipelineConfig:
    """The pipeline to run: a file, or the embedded default; ``{out}`` resolved."""
    cfg = load_pipeline(config, items=items) if config else default_pipeline(items=items)
    return resolve_out(cfg, out.resolve())


async def run_pipeline(
    cfg: PipelineConfig, out: Path, endpoint: str, quiet: bool = False, master_endpoint: str | None = None
) -> PipelineResult:
    """Run ``cfg`` on a one-host cluster started in this process, and stop it again.

    With ``master_endpoint``, a master runs here too (its journal under ``out/.troupe``), the
    items are a job submitted to it, and the pipeline leases them like a worker; without, the
    items are the config's seed range.
    """
    out.mkdir(parents=True, exist_ok=True)
    log_dir = out / "logs"
    configure_logging("local", "run", log_dir, console=False)
    node_cfg = NodeConfig(name="local", endpoint=endpoint, log_dir=log_dir, stop_grace_s=10, master=master_endpoint)
    progress = Progress(TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console,
                        disable=quiet)
    bars = {s.name: progress.add_task(s.name, total=cfg.items, note="") for s in cfg.stages}

    def show(m: PipelineMetrics) -> None:
        for s in m.stages:
            progress.update(bars[s.name], completed=s.items_out + s.failed,
                            note=f"q {s.queue_depth}/{s.queue_bound} x{s.replicas}")

    async with anyio.create_task_group() as tg:
        t0 = time.perf_counter()
        master = await _start_master(tg, master_endpoint, out) if master_endpoint else None
        node = await start_local_node(tg, node_cfg)
        if not quiet:
            console.print(f"node up in {time.perf_counter() - t0:.2f} s; running {cfg.items} items "
                          f"through {len(cfg.stages)} stages into {out}")
        try:
            async with connect(endpoint, "local") as rt:
                source = await _master_source(rt, master_endpoint, cfg) if master_endpoint else None
                engine = PipelineEngine(cfg, rt, endpoint, on_change=show, source=source)
                node.status_extras["pipeline"] = lambda: _pipeline_status(engine)
                with progress:
                    result = await engine.run()
                    show(result.metrics)
        finally:  # even when the run fails: stop and reap every worker before leaving
            node.stopping.set()
            with anyio.CancelScope(shield=True), anyio.move_on_after(60):
                await node.stopped.wait()
            if master is not None:
                master.stop()
    return result


async def _start_master(tg: anyio.abc.TaskGroup, endpoint: str, out: Path) -> Master:
    journal_dir = out / ".troupe"
    journal_dir.mkdir(parents=True, exist_ok=True)
    journal, book = open_journal(journal_dir / "journal.db", new=True)
    master = Master(MasterConfig(endpoint=endpoint, name="local-master"), journal, book)
    tg.start_soon(master.run)
    with anyio.fail_after(30):
        await master.ready.wait()
    return master


async def _master_source(rt: Any, master_endpoint: str, cfg: PipelineConfig) -> MasterSource:
    """Submit the pipeline's items as a job and lease them from the master."""
    job_id = f"{cfg.name}-{int(time.time() * 1000)}"
    job = {"job": {"name": cfg.name, "kind": cfg.name, "count": cfg.items, "seed_start": cfg.seed_start,
                   "max_attempts": cfg.max_attempts, "lease_s": 120, "backoff_base_s": 0.2,
                   "backoff_max_s": 5.0, "speculation": {"enabled": False}}}
    await rt.control(master_endpoint, "submit", {"job": job, "source": "troupe run", "job_id": job_id})
    first = cfg.stages[0]
    return MasterSource(rt, master_endpoint, job_id, slots=first.queue + first.most * first.batch)


def _pipeline_status(engine: PipelineEngine) -> dict[str, Any]:
    """The live stage metrics, for the node's status reply (`troupe ctl status`)."""
    from dataclasses import asdict

    m = engine.metrics()
    return {**asdict(m), "efficiency": m.efficiency}


def finish_run(config: Path | None, out: Path, items: int | None, endpoint: str, master_endpoint: str) -> None:
    """The body of ``troupe run``: run, finalize the dataset, print the tables."""
    from troupe.actors.lerobot_finalize import DatasetConfig, finalize_dataset
    from troupe.runtime.commit import OutputStore

    from .client import run_async

    cfg = run_async(_load, config, items, out)
    result = run_async(run_pipeline, cfg, out, endpoint, False, master_endpoint)
    m = result.metrics
    console.print(metrics_table(m))
    console.print(
        f"lambda {m.lambda_measured:.2f} items/s, lambda_theory {m.lambda_theory:.2f}, "
        f"lambda_succ {m.lambda_succ:.2f}; efficiency {m.efficiency:.2f}; "
        f"{m.items_ok} ok, {m.items_pruned} pruned, {m.items_dead} dead in {m.elapsed_s:.1f} s"
    )
    store_dir = next((s.kwargs["store"] for s in cfg.stages if "store" in s.kwargs), None)
    if store_dir is None:
        return
    fps = next((int(s.kwargs.get("fps", 10)) for s in cfg.stages if "fps" in s.kwargs), 10)
    summary = finalize_dataset(OutputStore(Path(store_dir)), out, DatasetConfig(fps=fps, robot_type="troupe_nav_camera"))
    console.print(f"dataset: {summary.total_episodes} episodes, {summary.total_frames} frames, "
                  f"LeRobot v3.0 at {out.resolve()}")


async def _load(config: Path | None, items: int | None, out: Path) -> PipelineConfig:
    return load_config(config, items, out)
