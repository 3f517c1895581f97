"""``troupe bench pipeline``: the sequential baseline against the troupe pipeline, same scenes.

The baseline (:func:`~troupe.cli.bench.baseline.sequential_baseline`) runs Load, Plan, Render
and Store in lockstep in one process, as a monolithic script does (torch with its default
threads), then writes the dataset. The troupe pipeline runs the same stage code in worker
processes joined by bounded queues, and writes the same dataset. Their figures:

- ``baseline_s``: the whole baseline, from the stages' construction to the dataset written;
  ``baseline_loop_s``: of it, from the first item in until the last was handed to the writer.
- ``pipeline_s``: the pipeline from the first item in to the last item's outcome;
  ``pipeline_wall_s``: the whole ``run_pipeline`` call, split in ``startup_s``, ``steady_s``
  and ``finalize_s``; ``startup_share`` = (start-up + finalisation) / the whole call.
- ``speedup`` = ``baseline_loop_s / pipeline_s`` (steady against steady);
  ``speedup_wall`` = ``baseline_s / pipeline_wall_s`` (whole against whole, as with
  ``--resolution``).
- ``cores``, ``baseline_cpu_s``, ``pipeline_cpu_s``, ``pipeline_children_left``,
  ``baseline_cores_used``, ``pipeline_cores_used``, ``speedup_wall_bound`` and
  ``speedup_cpu_bound``: how far any schedule could go on these cores, from CPU time measured in
  the same run; :mod:`troupe.cli.bench.baseline` defines each (the JSON under ``definitions``).
- ``lambda``, ``lambda_theory``, ``efficiency`` (their ratio), ``lambda_succ``: the
  pipeline's throughput model (:mod:`troupe.runtime.pipeline.model`).

Two synthetic workloads follow: one with configured stage costs (sleeps, so the CPU is free)
isolates the engine's own overhead; a CPU-bound one (``troupe.actors.bench.cpu_work``: Python
plan, numpy render, checksum + fsync store) is compared with the bound its stages' costs, each
measured alone in this run, allow on this machine's cores: ``synthetic_cpu_vs_bound``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from troupe.actors.datagen.config import default_pipeline
from troupe.runtime.logs import configure_logging
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.result import PipelineResult
from troupe.runtime.pipeline.runner import run_pipeline

from . import bench_children
from .baseline import (
    BaselineRun,
    children_left,
    cpu_figures,
    cpu_seconds,
    sequential_baseline,
    whole_run_lines,
)
from .stopping import bench_folder

__all__ = [
    "cpu_bound",
    "cpu_config",
    "measure_pipeline",
    "pipeline_lines",
    "run_against",
    "run_timed",
    "synthetic_config",
    "usable_cores",
]

CPU_REPLICAS = {"plan": 1, "render": 2, "store": 1}
"""Replicas of the CPU-bound stages, in proportion to their costs (about 8, 16 and 4 ms)."""


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
    done = bench_children.run(
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


def run_against(base: BaselineRun, cfg: PipelineConfig, out: Path) -> tuple[PipelineResult, dict[str, Any]]:
    """Run ``cfg`` into ``out`` with its CPU time counted; its result, and the figures both modes
    report of it against the baseline ``base`` (the whole runs and their CPU time bounds)."""
    c0 = cpu_seconds()
    result, wall = run_timed(cfg, out)
    pipeline_cpu_s = cpu_seconds() - c0
    return result, {
        "baseline_s": base.seconds,
        "baseline_items_per_s": base.ok / base.seconds,
        "baseline_ok": base.ok,
        "pipeline_wall_s": wall,
        "pipeline_ok": result.counts()["ok"],
        **cpu_figures(base, wall, pipeline_cpu_s, children_left(), usable_cores()),
        "startup_share": result.startup_share,
        "startup_s": result.startup_s,
        "steady_s": result.steady_s,
        "finalize_s": result.finalize_s,
    }


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
) -> dict[str, Any]:
    """Run the baseline, the pipeline and the synthetic workloads; return every figure."""
    say = progress or (lambda _m: None)
    configure_logging("bench", "bench", None, console=False, level="warning")  # stdout stays JSON
    fig: dict[str, Any] = {"items": float(items)}
    with bench_folder("troupe-bench-pipe-") as tmp:
        out = Path(tmp)
        cfg = default_pipeline(items=items).with_out(out / "pipeline")
        say(f"sequential baseline, {items} scenes")
        base = sequential_baseline(cfg, out / "baseline")
        say(f"troupe pipeline, {items} scenes")
        result, whole = run_against(base, cfg, out / "pipeline")
        m = result.metrics
        fig.update(
            whole,
            baseline_loop_s=base.loop_s,
            pipeline_s=m.elapsed_s,
            speedup=base.loop_s / m.elapsed_s,
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


def pipeline_lines(fig: dict[str, Any]) -> list[str]:
    """The figures of :func:`measure_pipeline` as lines for a person."""
    return [
        f"sequential baseline: {fig['baseline_s']:.2f} s for {fig['items']:.0f} scenes, the whole run "
        f"({fig['baseline_items_per_s']:.2f} items/s; {fig['baseline_loop_s']:.2f} s until the last "
        "item was handed to the writer)",
        *whole_run_lines(fig),
        f"steady: pipeline {fig['pipeline_s']:.2f} s from first item in; speedup {fig['speedup']:.2f}x "
        f"(baseline_loop_s / pipeline_s); "
        f"lambda {fig['lambda']:.2f}/s, lambda_theory {fig['lambda_theory']:.2f}/s, "
        f"lambda/lambda_theory {fig['efficiency']:.2f}, lambda_succ {fig['lambda_succ']:.2f}/s",
        f"synthetic: lambda {fig['synthetic_lambda']:.1f}/s vs lambda_theory "
        f"{fig['synthetic_lambda_theory']:.1f}/s: efficiency {fig['synthetic_efficiency']:.2f} "
        f"(configured ceiling 100/s: {fig['synthetic_vs_configured']:.2f})",
        f"CPU-bound synthetic: lambda {fig['synthetic_cpu_lambda']:.1f}/s vs the "
        f"{fig['synthetic_cpu_cores']:.0f}-core bound of its stages' isolated costs "
        f"{fig['synthetic_cpu_bound']:.1f}/s: synthetic_cpu_vs_bound {fig['synthetic_cpu_vs_bound']:.2f}; "
        f"engine per-item time / in-actor time, worst stage: {fig['synthetic_cpu_engine_vs_actor_max']:.3f}",
    ]
