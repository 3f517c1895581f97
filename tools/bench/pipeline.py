"""``troupe bench pipeline``: the sequential baseline against the troupe pipeline, same scenes.

The baseline runs Load, Plan, Render and Store in lockstep in one process, as a monolithic
script does (torch with its default threads). The troupe pipeline runs the same stage code in
worker processes joined by bounded queues. A synthetic workload with configured stage costs
(sleeps, so the CPU is free) isolates the engine's own overhead.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from troupe.actors.datagen.config import default_pipeline, resolve_out
from troupe.actors.datagen.lifecycle import (
    LeRobotWriter,
    NavPlanner,
    RaycastRenderer,
    SceneLoader,
)
from troupe.cli.commands.run_pipeline import run_pipeline
from troupe.runtime.logs import configure_logging
from troupe.runtime.pipeline.config import PipelineConfig

from .messaging import free_endpoint

__all__ = ["measure_pipeline", "synthetic_config"]


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


def measure_pipeline(items: int = 64, synthetic_items: int = 300, progress: Any = None) -> dict[str, float]:
    """Run the baseline, the pipeline and the synthetic workload; return every figure."""
    say = progress or (lambda _m: None)
    configure_logging("bench", "bench", None, console=False, level="warning")  # stdout stays JSON
    fig: dict[str, float] = {"items": float(items)}
    with tempfile.TemporaryDirectory(prefix="troupe-bench-pipe-") as tmp:
        out = Path(tmp)
        cfg = resolve_out(default_pipeline(items=items), out / "pipeline")
        say(f"sequential baseline, {items} scenes")
        base_s, base_ok = _sequential(cfg, out)
        fig["baseline_s"] = base_s
        fig["baseline_items_per_s"] = base_ok / base_s
        say(f"troupe pipeline, {items} scenes")
        t0 = time.perf_counter()
        result = anyio.run(
            run_pipeline,
            cfg,
            out / "pipeline",
            free_endpoint(),
            True,
            free_endpoint(),
            backend="asyncio",
            backend_options={"use_uvloop": True},
        )
        wall = time.perf_counter() - t0
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
        syn = anyio.run(
            run_pipeline,
            synthetic_config(synthetic_items),
            out / "synthetic",
            free_endpoint(),
            True,
            backend="asyncio",
            backend_options={"use_uvloop": True},
        ).metrics
        fig.update(
            synthetic_lambda=syn.lambda_measured,
            synthetic_lambda_theory=syn.lambda_theory,
            synthetic_efficiency=syn.efficiency,
            synthetic_configured_theory=100.0,
            synthetic_vs_configured=syn.lambda_measured / 100.0,
        )
    return fig
