"""``troupe bench pipeline --resolution WxH``: the data generation pipeline at a real image size.

The default pipeline (load, plan, render, store) renders at ``WxH``; a sequential baseline (one
process, lockstep, torch with its default threads, the same stage code, and the same dataset
written at the end) runs the same scenes as the troupe pipeline, in one run on one machine.
Beside the speedup it reports what a real size costs: the bytes of one item's frames, the bytes
that passed through the engine's process per item, and the render stage's frames/s on the CPU
(and on CUDA where torch sees a device).

It also reports how far any schedule could go on these cores, from CPU time measured in the
same run (user + system seconds of every thread of every process involved):

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

import math
import os
import re
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psutil

from troupe.actors.datagen.config import default_pipeline
from troupe.actors.datagen.lifecycle import LeRobotWriter, NavPlanner, RaycastRenderer, SceneLoader
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.config import MAX_MESSAGE_MB
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.result import PipelineResult
from troupe.runtime.pipeline.stage import StageRun

from .pipeline import run_timed, usable_cores

__all__ = [
    "DEFINITIONS",
    "BaselineRun",
    "IncompleteRun",
    "cpu_seconds",
    "default_scenes",
    "measure_resolution",
    "parse_resolution",
    "resolution_pipeline",
    "sequential_baseline",
]

MAX_SIDE = 4096
"""The largest width or height accepted: a 4096x4096 item of 60 frames is already 4 GiB."""

SCENES_AT_640X480 = 16
"""Scenes of the default 640x480 run (seeds 0-15: 606 frames): the whole bench (baseline,
pipeline, GPU pass) stays within about 3 minutes on a quiet 2-core machine."""

MAX_DEFAULT_SCENES = 64
RENDER_PROBE_ITEMS = 2
"""Items whose frames a render-only pass renders (the CPU pass when the baseline ran on CUDA,
and the CUDA pass)."""

_RESOLUTION = re.compile(r"([0-9]+)x([0-9]+)")


def parse_resolution(text: str) -> tuple[int, int]:
    """``"640x480"`` -> ``(640, 480)``.

    Raises:
        ValueError: not ``WIDTHxHEIGHT``, or a side outside 1..MAX_SIDE; the message names
            ``--resolution`` and the value.
    """
    match = _RESOLUTION.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"--resolution {text!r}: give WIDTHxHEIGHT in pixels, e.g. 640x480")
    width, height = int(match[1]), int(match[2])
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise ValueError(f"--resolution {text!r}: width and height must be 1 to {MAX_SIDE} pixels")
    return width, height


def default_scenes(width: int, height: int) -> int:
    """Scenes for a run at ``width x height``: SCENES_AT_640X480 there, in inverse proportion to
    the pixels elsewhere (at least 2, at most MAX_DEFAULT_SCENES)."""
    share = (640 * 480) / (width * height)
    return max(2, min(MAX_DEFAULT_SCENES, math.floor(SCENES_AT_640X480 * share)))


def resolution_pipeline(width: int, height: int, scenes: int) -> PipelineConfig:
    """The default pipeline rendering at ``width x height``, its replicas sized for large items.

    Render dominates at real sizes on the CPU: two replicas of one torch thread each (torch's
    threads in one replica wait for each other at every op, and collapse when another process
    takes a core); the other stages keep the default pipeline's replicas.
    """
    cfg = default_pipeline(items=scenes)
    stages = []
    for stage in cfg.stages:
        update: dict[str, Any] = {}
        if stage.name == "load":
            update["kwargs"] = {**stage.kwargs, "width": width, "height": height}
        elif stage.name == "render":
            update.update(replicas=2, max_replicas=2, queue=2)
        elif stage.name == "store":
            update["queue"] = 2  # an item is ~100 MB here: two queued are enough to overlap
        stages.append(stage.model_copy(update=update))
    # Slots for every replica the scaler may start (a second store once render is fast: CUDA).
    slots = sum(s.max_replicas or s.replicas for s in stages)
    # An item is handed from render to store as one message: RGB + float32 depth per frame.
    plan = next(s for s in cfg.stages if s.name == "plan")
    frames = int(plan.kwargs.get("max_frames", 60))
    item_mb = width * height * 7 * frames / (1 << 20)
    bound = min(MAX_MESSAGE_MB, max(64.0, math.ceil(item_mb * 1.5)))
    return cfg.model_copy(update={"stages": tuple(stages), "slots": slots, "max_message_mb": bound})


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (every thread) and of every child it has reaped
    (with theirs: a process's reaped children count in its own ``RUSAGE_CHILDREN``)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _children_left() -> int:
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
"""The CPU time figures of :func:`measure_resolution`, as its JSON gives them (``definitions``)."""


class IncompleteRun(RuntimeError):
    """Nothing to compare: no scene could be planned, or the pipeline stored fewer items than
    the baseline."""


@dataclass(frozen=True)
class BaselineRun:
    """What the sequential baseline did.

    Attributes:
        seconds: wall time from the stages' construction to the dataset written.
        cpu_s: CPU seconds (user + system, every thread, and any child reaped) over ``seconds``.
        ok: items stored.
        frames: frames rendered (over every stored item).
        render_s: seconds in the render stage alone.
        device: where the renderer ran.
    """

    seconds: float
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

    for i in range(cfg.items):
        item: dict[str, Any] = {"task_id": f"{i:06d}", "seed": cfg.seed_start + i}
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
    writer.writer.close(timeout=600)
    writer.finalize(run)
    seconds, cpu_s = time.perf_counter() - t0, cpu_seconds() - c0
    return BaselineRun(seconds, cpu_s, ok, frames, render_s, str(renderer.device))


def render_fps(cfg: PipelineConfig, device: str, items: int = RENDER_PROBE_ITEMS) -> float:
    """Frames/s of the render stage alone on ``device`` over the first ``items`` plannable scenes
    (on CUDA after one untimed render: its context and kernels start lazily)."""
    import torch

    kw = {s.name: dict(s.kwargs) for s in cfg.stages}
    loader, planner = SceneLoader(**kw["load"]), NavPlanner(**kw["plan"])
    renderer = RaycastRenderer(device=device, threads=None)
    planned: list[dict[str, Any]] = []
    for i in range(cfg.items * 4):  # a few scenes have no reachable goal
        if len(planned) == items:
            break
        try:
            planned.append(planner.process(loader.process({"task_id": f"{i}", "seed": cfg.seed_start + i})))
        except Exception:
            continue
    if not planned:
        raise RuntimeError(f"render probe: none of {cfg.items * 4} scenes could be planned")
    if device.startswith("cuda"):
        renderer.process(planned[0])
    frames = 0
    t0 = time.perf_counter()
    for item in planned:
        frames += int(renderer.process(item)["rgb"].shape[0])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return frames / (time.perf_counter() - t0)


def _ran(result: PipelineResult) -> int:
    return sum(1 for outcome in result.outcomes.values() if outcome != "kept")


def measure_resolution(
    width: int, height: int, scenes: int | None = None, progress: Any = None
) -> dict[str, Any]:
    """The baseline against the troupe pipeline at ``width x height``; every figure."""
    import torch

    say = progress or (lambda _m: None)
    configure_logging("bench", "bench", None, console=False, level="warning")  # stdout stays JSON
    scenes = scenes or default_scenes(width, height)
    cfg = resolution_pipeline(width, height, scenes)
    fig: dict[str, Any] = {"resolution": f"{width}x{height}", "items": scenes}
    with tempfile.TemporaryDirectory(prefix="troupe-bench-res-") as tmp:
        out = Path(tmp)
        say(f"sequential baseline, {scenes} scenes at {width}x{height}")
        base = sequential_baseline(cfg, out / "baseline")
        if base.ok == 0:
            raise IncompleteRun(f"no scene of {scenes} could be planned; give more --scenes")
        say(f"troupe pipeline, {scenes} scenes at {width}x{height}")
        c0 = cpu_seconds()
        result, wall = run_timed(cfg.with_out(out / "pipeline"), out / "pipeline")
        pipeline_cpu_s = cpu_seconds() - c0
        children_left = _children_left()
        stored = result.counts()["ok"]
        if stored != base.ok:
            why = next(iter(result.errors.values()), "no error recorded")
            raise IncompleteRun(
                f"the pipeline stored {stored} of the {base.ok} scenes the baseline stored; "
                f"first error: {why}"
            )
        frames_per_item = base.frames / base.ok
        engine_bytes = getattr(result, "engine_bytes", None)
        ran = _ran(result)
        cores = usable_cores()
        fig.update(
            baseline_s=base.seconds,
            baseline_items_per_s=base.ok / base.seconds,
            baseline_ok=base.ok,
            baseline_render_device=base.device,
            pipeline_wall_s=wall,
            pipeline_ok=stored,
            speedup_wall=base.seconds / wall,
            cores=cores,
            baseline_cpu_s=base.cpu_s,
            pipeline_cpu_s=pipeline_cpu_s,
            pipeline_children_left=children_left,
            baseline_cores_used=base.cpu_s / base.seconds,
            pipeline_cores_used=pipeline_cpu_s / wall,
            speedup_wall_bound=base.seconds / (base.cpu_s / cores),
            speedup_cpu_bound=base.seconds / (pipeline_cpu_s / cores),
            definitions=DEFINITIONS,
            startup_share=result.startup_share,
            startup_s=result.startup_s,
            steady_s=result.steady_s,
            finalize_s=result.finalize_s,
            frames_per_item=frames_per_item,
            item_bytes=round(frames_per_item * width * height * (3 + 4)),  # uint8 RGB + float32 depth
            engine_bytes_per_item=None if engine_bytes is None or not ran else engine_bytes / ran,
            stages={
                s.name: {
                    "replicas": s.replicas,
                    "actor_s_per_item": s.actor_latency_s,
                    "busy": s.busy_fraction,
                }
                for s in result.metrics.stages
            },
        )
        if base.device == "cpu":
            fig["render_fps_cpu"] = base.frames / base.render_s
        else:
            say("render stage alone on the CPU")
            fig["render_fps_cpu"] = render_fps(cfg, "cpu")
        # torch's threads are fast on an idle machine and slow when other processes take a core
        # (its workers wait for each other): one thread beside it shows which one this run saw.
        say("render stage alone on the CPU, one torch thread")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            fig["render_fps_cpu_one_thread"] = render_fps(cfg, "cpu")
        finally:
            torch.set_num_threads(threads)
        if torch.cuda.is_available():
            say("render stage alone on CUDA")
            fig["render_fps_gpu"] = render_fps(cfg, "cuda")
            fig["render_fps_gpu_note"] = f"CUDA device: {torch.cuda.get_device_name(0)}"
        else:
            fig["render_fps_gpu"] = None
            fig["render_fps_gpu_note"] = "not measured: torch.cuda.is_available() is False on this machine"
    return fig


def resolution_lines(fig: dict[str, Any]) -> list[str]:
    """The figures of :func:`measure_resolution` as lines for a person."""
    ebpi = fig["engine_bytes_per_item"]
    gpu = fig["render_fps_gpu"]
    return [
        f"{fig['resolution']}, {fig['items']} scenes, {fig['frames_per_item']:.1f} frames per item "
        f"({fig['item_bytes'] / 2**20:.1f} MiB of RGB + depth per item)",
        f"sequential baseline: {fig['baseline_s']:.2f} s ({fig['baseline_items_per_s']:.3f} items/s, "
        f"render on {fig['baseline_render_device']})",
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
        + (
            ""
            if not fig["pipeline_children_left"]
            else f"; {fig['pipeline_children_left']} of its processes still ran after it: not counted"
        ),
        "bytes through the engine per item: "
        + ("not reported by this runtime" if ebpi is None else f"{ebpi:,.0f} B"),
        f"render alone: {fig['render_fps_cpu']:.2f} frames/s on the CPU "
        f"({fig['render_fps_cpu_one_thread']:.2f} with one torch thread), "
        + (f"{gpu:.1f} frames/s on CUDA ({fig['render_fps_gpu_note']})" if gpu is not None else "")
        + ("" if gpu is not None else f"CUDA {fig['render_fps_gpu_note']}"),
    ]
