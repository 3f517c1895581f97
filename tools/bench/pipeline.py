"""``troupe bench pipeline``: the sequential baseline against the troupe pipeline, same scenes.

The baseline runs Load, Plan, Render and Store in lockstep in one process, as a monolithic
script does (torch with its default threads). The troupe pipeline runs the same stage code in
worker processes joined by bounded queues. Two synthetic workloads follow: one with configured
stage costs (sleeps, so the CPU is free) isolates the engine's own overhead; a CPU-bound one
(``troupe.actors.bench.cpu_work``: Python plan, numpy render, checksum + fsync store) is
compared with the bound its stages' costs, each measured alone in this run, allow on this
machine's cores: ``synthetic_cpu_vs_bound``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from troupe.actors.datagen.config import default_pipeline
from troupe.actors.datagen.lifecycle import (
    LeRobotWriter,
    NavPlanner,
    RaycastRenderer,
    SceneLoader,
)
from troupe.runtime.logs import configure_logging
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.result import PipelineResult
from troupe.runtime.pipeline.runner import run_pipeline

__all__ = ["cpu_bound", "cpu_config", "measure_pipeline", "run_timed", "synthetic_config", "usable_cores"]

CPU_REPLICAS = {"plan": 1, "render": 2, "store": 1}
"""Replicas of the CPU-bound stages, in proportion to their costs (about 8, 16 and 4 ms)."""


def _sequential(cfg: PipelineConfig, out: Path) -> tuple[float, int]:
    kw = {s.name: dict(s.kwargs) for s in cfg.stages}
    loader = SceneLoader(**kw["load"])
    planner = NavPlanner(**kw["plan"])
    renderer = RaycastRenderer(threads=None)  # a monolithic script leaves torch's threads alone
    writer = LeRobotWriter(str(out / "baseline-store"))
    ok = 0

    async def store(item: dict[str, Any]) -> None:
        await writer.process(item)

    t0 = time.perf_counter()
    for i in range(cfg.items):
        item: dict[str, Any] = {"task_id": f"base-{i:06d}", "seed": cfg.seed_start + i}
        try:
            item = planner.process(loader.process(item))
        except Exception:  # a pruned plan: the baseline skips the item as the pipeline does
            continue
        anyio.run(store, renderer.process(item))
        ok += 1
    elapsed = time.perf_counter() - t0
    writer.writer.close(timeout=60)
    return elapsed, ok


def synthetic_config(items: int) -> PipelineConfig:
    """Three stages of 10, 30 and 20 ms per item with 1, 3 and 2 replicas: 100 items/s each."""
    stages = [("a", 0.01, 1), ("b", 0.03, 3), ("c", 0.02, 2)]
    return PipelineConfig.model_validate(
        {
            "name": "synthetic",
            "items": items,
            "scale_interval_s": 1.0,
            "stages": [
                {
                    "name": n,
                    "actor": "troupe.actors.bench.synthetic:CostStage",
                    "replicas": r,
                    "max_replicas": r,
                    "queue": 16,
                    "kwargs": {"cost_s": c},
                }
                for n, c, r in stages
            ],
        }
    )


def cpu_config(items: int, directory: Path) -> PipelineConfig:
    """The CPU-bound synthetic pipeline: plan -> render -> store, replicas in proportion."""
    actors = {"plan": "CpuPlan", "render": "CpuRender", "store": "CpuStore"}
    return PipelineConfig.model_validate(
        {
            "name": "synthetic-cpu",
            "items": items,
            "scale_interval_s": 1.0,
            "stages": [
                {
                    "name": name,
                    "actor": f"troupe.actors.bench.cpu_work:{actors[name]}",
                    "replicas": n,
                    "max_replicas": n,
                    "queue": 8,
                    "kwargs": {"directory": str(directory)} if name == "store" else {},
                }
                for name, n in CPU_REPLICAS.items()
            ],
        }
    )


def _isolated_costs_apart(directory: Path) -> dict[str, float]:
    """:func:`~troupe.actors.bench.cpu_work.isolated_costs` in a fresh interpreter, as a replica is."""
    code = (
        "import json, sys; from troupe.actors.bench.cpu_work import isolated_costs; "
        "print(json.dumps(isolated_costs(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(directory)], capture_output=True, text=True, timeout=300, check=True
    )
    costs: dict[str, float] = json.loads(done.stdout)
    return costs


def cpu_bound(costs: dict[str, float], cores: int) -> float:
    """Items/s the stages' costs allow: all cores busy, and no stage past its replicas."""
    per_core = cores / sum(costs.values())
    per_stage = min(CPU_REPLICAS[name] / cost for name, cost in costs.items())
    return min(per_core, per_stage)


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity mask's size (os.cpu_count() elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_timed(cfg: PipelineConfig, out: Path) -> tuple[PipelineResult, float]:
    """Run ``cfg`` on uvloop into ``out``; its result and the call's whole wall time."""
    t0 = time.perf_counter()
    result = anyio.run(
        lambda: run_pipeline(cfg, out, keep_outputs=False),
        backend="asyncio",
        backend_options={"use_uvloop": True},
    )
    return result, time.perf_counter() - t0


def measure_cpu_bound(items: int, directory: Path, say: Any) -> dict[str, float]:
    """The CPU-bound workload through troupe against the bound of its isolated costs."""
    say("isolated stage costs of the CPU-bound workload")
    # In a fresh process, as a replica is: this one has imported torch and run other workloads.
    costs = _isolated_costs_apart(directory / "iso")
    cores = usable_cores()
    bound = cpu_bound(costs, cores)
    say(f"CPU-bound synthetic workload, {items} items on {cores} cores")
    result, _ = run_timed(cpu_config(items, directory / "store"), directory / "run")
    m = result.metrics
    fig = {
        "synthetic_cpu_lambda": m.lambda_measured,
        "synthetic_cpu_bound": bound,
        "synthetic_cpu_vs_bound": m.lambda_measured / bound,
        "synthetic_cpu_cores": float(cores),
        "synthetic_cpu_ok": float(m.items_ok),
    }
    for s in m.stages:
        fig[f"synthetic_cpu_{s.name}_isolated_s"] = costs[s.name]
        fig[f"synthetic_cpu_{s.name}_actor_s"] = s.actor_latency_s
        fig[f"synthetic_cpu_{s.name}_engine_s"] = s.latency_s
        fig[f"synthetic_cpu_{s.name}_engine_vs_actor"] = (
            s.latency_s / s.actor_latency_s if s.actor_latency_s else 0.0
        )
    fig["synthetic_cpu_engine_vs_actor_max"] = max(
        (fig[f"synthetic_cpu_{s.name}_engine_vs_actor"] for s in m.stages), default=0.0
    )
    return fig


def measure_pipeline(
    items: int = 64, synthetic_items: int = 300, progress: Any = None, cpu_items: int = 400
) -> dict[str, float]:
    """Run the baseline, the pipeline and the synthetic workloads; return every figure."""
    say = progress or (lambda _m: None)
    configure_logging("bench", "bench", None, console=False, level="warning")  # stdout stays JSON
    fig: dict[str, float] = {"items": float(items)}
    with tempfile.TemporaryDirectory(prefix="troupe-bench-pipe-") as tmp:
        out = Path(tmp)
        cfg = default_pipeline(items=items).with_out(out / "pipeline")
        say(f"sequential baseline, {items} scenes")
        base_s, base_ok = _sequential(cfg, out)
        fig["baseline_s"] = base_s
        fig["baseline_items_per_s"] = base_ok / base_s
        say(f"troupe pipeline, {items} scenes")
        result, wall = run_timed(cfg, out / "pipeline")
        m = result.metrics
        fig.update(
            pipeline_s=m.elapsed_s,
            pipeline_wall_s=wall,
            speedup=base_s / m.elapsed_s,
            speedup_wall=base_s / wall,
            **{"lambda": m.lambda_measured},
            lambda_theory=m.lambda_theory,
            lambda_succ=m.lambda_succ,
            efficiency=m.efficiency,
        )
        say(f"synthetic workload, {synthetic_items} items")
        syn = run_timed(synthetic_config(synthetic_items), out / "synthetic")[0].metrics
        fig.update(
            synthetic_lambda=syn.lambda_measured,
            synthetic_lambda_theory=syn.lambda_theory,
            synthetic_efficiency=syn.efficiency,
            synthetic_configured_theory=100.0,
            synthetic_vs_configured=syn.lambda_measured / 100.0,
        )
        fig.update(measure_cpu_bound(cpu_items, out / "cpu", say))
    return fig
