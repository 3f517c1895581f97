"""The sequential baseline both modes of ``troupe bench pipeline`` compare troupe with, and the
CPU time figures that bound the speedup.

The baseline runs load, plan, render and store in lockstep in this process, as a monolithic
script does (the same stage classes and kwargs as the pipeline's; torch with its default
threads), then writes the dataset: :func:`sequential_baseline`. Its two clocks:

- ``baseline_s``: the whole baseline, from the stages' construction to the dataset written
  (the writer's threads drained): what the whole ``run_pipeline`` call (``pipeline_wall_s``)
  is compared with, in ``speedup_wall = baseline_s / pipeline_wall_s``.
- ``baseline_loop_s`` (the default mode): from the first item in until the last item was
  handed to the writer: the baseline's steady part, what the pipeline's ``pipeline_s`` (first
  item in to last item out) is compared with, in ``speedup``.

How far any schedule could go on these cores, from CPU time measured in the same run (user +
system seconds of every thread of every process involved): :func:`cpu_figures`.

- ``cores``: the CPUs this process may run on (its affinity mask's size).
- ``baseline_cpu_s``: CPU seconds the sequential baseline used (this process, where it runs,
  over the span of ``baseline_s``; plus any child it reaped, of which it has none today).
- ``pipeline_cpu_s``: CPU seconds of the whole troupe run over the span of ``pipeline_wall_s``:
  this process (engine, master and node run in it) plus every process the run started and
  reaped (template, its forked workers, spawned workers, supervisor), from ``RUSAGE_CHILDREN``.
  The node is a child subreaper for its template's forks and reaps every worker and the
  supervisor before the run returns; the template reaps its intermediate forks. So nothing
  the run started escapes the count: ``pipeline_children_left`` (processes of ours still there
  after the run, whose CPU time would be missing) says so: 0, as the tests check.
- ``baseline_cores_used`` = ``baseline_cpu_s / baseline_s``; ``pipeline_cores_used`` =
  ``pipeline_cpu_s / pipeline_wall_s``: the cores each kept busy on average.
- ``speedup_wall_bound`` = ``baseline_s / (baseline_cpu_s / cores)`` (= ``cores /
  baseline_cores_used``): the speedup over the baseline that a perfect schedule of the
  baseline's own CPU work on these cores could reach, since that work cannot finish before its
  CPU seconds spread over every core. It leaves out every other limit (one item's stages run
  in order, start-up, the dataset's final write), each of which can only lower it; a schedule
  that does less CPU work than the baseline (torch without its threads' waiting) can pass it.
- ``speedup_cpu_bound`` = ``baseline_s / (pipeline_cpu_s / cores)``: the speedup troupe's run
  would reach doing the CPU work it did, with its cores never idle.

``speedup_wall`` close to ``speedup_wall_bound`` means the baseline already kept the cores busy
(torch renders on all of them) and no schedule of that work can do much better here. Both bounds
mean that on a quiet machine only: where other processes take the cores, each run gets less than
``cores`` of them (``*_cores_used`` drop, the bounds rise), and torch's threads burn CPU time
waiting for each other, which swells ``baseline_cpu_s``. The JSON repeats these definitions
under ``definitions``.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psutil

from troupe.actors.datagen.lifecycle import LeRobotWriter, NavPlanner, RaycastRenderer, SceneLoader
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.stage import StageRun
from troupe.runtime.tasks.jobspec import generated_task_id

__all__ = [
    "DEFINITIONS",
    "BaselineRun",
    "children_left",
    "cpu_figures",
    "cpu_seconds",
    "sequential_baseline",
    "whole_run_lines",
]


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (every thread) and of every child it has reaped
    (with theirs: a process's reaped children count in its own ``RUSAGE_CHILDREN``)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def children_left() -> int:
    """Processes this one started (at any depth) that are still there: live, or unreaped."""
    return len(psutil.Process(os.getpid()).children(recursive=True))


DEFINITIONS = {
    "cores": "CPUs this process may run on (its affinity mask's size)",
    "baseline_cpu_s": "user + system CPU seconds of the sequential baseline over baseline_s",
    "pipeline_cpu_s": "user + system CPU seconds over pipeline_wall_s of this process and of every "
    "process the run started (reaped within it: RUSAGE_CHILDREN)",
    "pipeline_children_left": "processes of this one still there after the run (their CPU time is "
    "not counted)",
    "baseline_cores_used": "baseline_cpu_s / baseline_s",
    "pipeline_cores_used": "pipeline_cpu_s / pipeline_wall_s",
    "speedup_wall_bound": "baseline_s / (baseline_cpu_s / cores): the most a perfect schedule of the "
    "baseline's CPU work on these cores could reach",
    "speedup_cpu_bound": "baseline_s / (pipeline_cpu_s / cores): what troupe's run would reach doing "
    "its CPU work with no core ever idle",
}
"""The CPU time figures of :func:`cpu_figures`, as the JSON gives them (``definitions``)."""


@dataclass(frozen=True)
class BaselineRun:
    """What the sequential baseline did.

    Attributes:
        seconds: wall time from the stages' construction to the dataset written (the writer's
            threads drained).
        loop_s: wall time from the first item in until the last item was handed to the writer
            (its threads may still be writing it, and the dataset is not written yet).
        cpu_s: CPU seconds (user + system, every thread, and any child reaped) over ``seconds``.
        ok: items stored.
        frames: frames rendered (over every stored item).
        render_s: seconds in the render stage alone.
        device: where the renderer ran.
    """

    seconds: float
    loop_s: float
    cpu_s: float
    ok: int
    frames: int
    render_s: float
    device: str


def sequential_baseline(cfg: PipelineConfig, out: Path) -> BaselineRun:
    """Load, plan, render and store each scene in turn, then write the dataset, in this process.

    The same stage classes and kwargs as the pipeline's, except the renderer keeps torch's
    default threads (as a monolithic script does) and the stages run one item at a time.
    """
    kw = {s.name: dict(s.kwargs) for s in cfg.stages}
    t0, c0 = time.perf_counter(), cpu_seconds()
    loader = SceneLoader(**kw["load"])
    planner = NavPlanner(**kw["plan"])
    renderer = RaycastRenderer(threads=None)
    writer = LeRobotWriter(str(out / "store"))
    run = StageRun(cfg.name, "store", cfg.items, cfg.seed_start, out=str(out / "dataset"), fresh=True)
    writer.start(run)
    ok = frames = 0
    render_s = 0.0

    async def store(item: dict[str, Any]) -> None:
        await writer.process(item)

    loop_t0 = time.perf_counter()
    for i in range(cfg.items):
        # The pipeline's ids: the writer's finalize takes the run's items' episodes only.
        item: dict[str, Any] = {"task_id": generated_task_id(cfg.name, i), "seed": cfg.seed_start + i}
        try:
            item = planner.process(loader.process(item))
        except Exception:  # a pruned plan: skipped, as the pipeline prunes it
            continue
        r0 = time.perf_counter()
        item = renderer.process(item)
        render_s += time.perf_counter() - r0
        frames += int(item["rgb"].shape[0])
        anyio.run(store, item)
        ok += 1
    loop_s = time.perf_counter() - loop_t0
    writer.writer.close(timeout=600)
    writer.finalize(run)
    seconds, cpu_s = time.perf_counter() - t0, cpu_seconds() - c0
    return BaselineRun(seconds, loop_s, cpu_s, ok, frames, render_s, str(renderer.device))


def cpu_figures(
    base: BaselineRun, pipeline_wall_s: float, pipeline_cpu_s: float, left: int, cores: int
) -> dict[str, Any]:
    """The whole-run comparison and its CPU time bounds (the module docstring defines each).

    Args:
        base: the sequential baseline's run.
        pipeline_wall_s: the whole ``run_pipeline`` call's wall time.
        pipeline_cpu_s: :func:`cpu_seconds` spent over that call.
        left: :func:`children_left` after that call.
        cores: the CPUs this process may run on.
    """
    return {
        "speedup_wall": base.seconds / pipeline_wall_s,
        "cores": cores,
        "baseline_cpu_s": base.cpu_s,
        "pipeline_cpu_s": pipeline_cpu_s,
        "pipeline_children_left": left,
        "baseline_cores_used": base.cpu_s / base.seconds,
        "pipeline_cores_used": pipeline_cpu_s / pipeline_wall_s,
        "speedup_wall_bound": base.seconds / (base.cpu_s / cores),
        "speedup_cpu_bound": base.seconds / (pipeline_cpu_s / cores),
        "definitions": DEFINITIONS,
    }


def whole_run_lines(fig: dict[str, Any]) -> list[str]:
    """For a person: the pipeline's whole run split in its parts, ``speedup_wall`` beside its two
    bounds, and the CPU time of each side (the figures of :func:`cpu_figures` and the run's
    ``startup_s``, ``steady_s``, ``finalize_s`` and ``startup_share``)."""
    left = fig["pipeline_children_left"]
    return [
        f"troupe pipeline:     {fig['pipeline_wall_s']:.2f} s, the whole run "
        f"(start-up {fig['startup_s']:.2f} s, "
        f"steady {fig['steady_s']:.2f} s, finalisation {fig['finalize_s']:.2f} s; "
        f"start-up share {fig['startup_share']:.0%})",
        f"speedup_wall {fig['speedup_wall']:.2f}x; speedup_wall_bound {fig['speedup_wall_bound']:.2f}x "
        f"(the baseline's CPU work spread over all {fig['cores']} cores); "
        f"speedup_cpu_bound {fig['speedup_cpu_bound']:.2f}x (troupe's CPU work, no core ever idle)",
        f"CPU time: baseline {fig['baseline_cpu_s']:.2f} s ({fig['baseline_cores_used']:.2f} of "
        f"{fig['cores']} cores busy), troupe {fig['pipeline_cpu_s']:.2f} s "
        f"({fig['pipeline_cores_used']:.2f} of {fig['cores']} cores busy, every process of the run)"
        + ("" if not left else f"; {left} of its processes still ran after it: not counted"),
    ]
