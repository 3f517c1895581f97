"""``troupe bench pipeline --resolution WxH``: the data generation pipeline at a real image size.

The default pipeline (load, plan, render, store) renders at ``WxH``; a sequential baseline (one
process, lockstep, torch with its default threads, the same stage code, and the same dataset
written at the end) runs the same scenes as the troupe pipeline, in one run on one machine.
Beside the speedup it reports what a real size costs: the bytes of one item's frames, the bytes
that passed through the engine's process per item, and the render stage's frames/s on the CPU
(and on CUDA where torch sees a device).

Beside ``speedup_wall`` (``baseline_s / pipeline_wall_s``, the whole baseline against the whole
``run_pipeline`` call) it reports the pipeline's ``startup_s``, ``steady_s``, ``finalize_s`` and
``startup_share``, and how far any schedule could go on these cores, from CPU time measured in
the same run: ``cores``, ``baseline_cpu_s``, ``pipeline_cpu_s``, ``pipeline_children_left``,
``baseline_cores_used``, ``pipeline_cores_used``, ``speedup_wall_bound`` and
``speedup_cpu_bound``, as the default mode does; :mod:`troupe.cli.bench.baseline` defines each
(and the JSON under ``definitions``).
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

from troupe.actors.datagen.config import default_pipeline
from troupe.actors.datagen.lifecycle import NavPlanner, RaycastRenderer, SceneLoader
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.config import MAX_MESSAGE_MB
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.result import PipelineResult

from .baseline import sequential_baseline, whole_run_lines
from .pipeline import run_against
from .stopping import bench_folder

__all__ = [
    "IncompleteRun",
    "default_scenes",
    "measure_resolution",
    "parse_resolution",
    "resolution_lines",
    "resolution_pipeline",
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


class IncompleteRun(RuntimeError):
    """Nothing to compare: no scene could be planned, or the pipeline stored fewer items than
    the baseline."""


def render_fps(cfg: PipelineConfig, device: str, items: int = RENDER_PROBE_ITEMS) -> float:
    """Frames/s of the render stage alone on ``device`` over the first ``items`` plannable scenes,
    after one untimed render (CUDA's context and kernels start lazily; on the CPU the first
    render's allocations and torch's thread pool, which a run of a few scenes would mostly
    measure)."""
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
    with bench_folder("troupe-bench-res-") as tmp:
        out = Path(tmp)
        say(f"sequential baseline, {scenes} scenes at {width}x{height}")
        base = sequential_baseline(cfg, out / "baseline")
        if base.ok == 0:
            raise IncompleteRun(f"no scene of {scenes} could be planned; give more --scenes")
        say(f"troupe pipeline, {scenes} scenes at {width}x{height}")
        result, whole = run_against(base, cfg.with_out(out / "pipeline"), out / "pipeline")
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
        fig.update(
            whole,
            baseline_render_device=base.device,
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
        # The same probe for both figures beside each other: the baseline's own render time
        # counts its first render's start-up, most of it in a run of a few scenes (12 frames/s
        # against 207 with one thread, at 160x120 and 2 scenes).
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
        *whole_run_lines(fig),
        "bytes through the engine per item: "
        + ("not reported by this runtime" if ebpi is None else f"{ebpi:,.0f} B"),
        f"render alone: {fig['render_fps_cpu']:.2f} frames/s on the CPU "
        f"({fig['render_fps_cpu_one_thread']:.2f} with one torch thread), "
        + (f"{gpu:.1f} frames/s on CUDA ({fig['render_fps_gpu_note']})" if gpu is not None else "")
        + ("" if gpu is not None else f"CUDA {fig['render_fps_gpu_note']}"),
    ]
