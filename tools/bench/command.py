"""``troupe bench``: measurements that print each figure beside its ceiling."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from troupe.cli.client import fail, within
from troupe.cli.literal import literal

from .bounds import (
    MOST_ACTORS,
    MOST_CPU_ITEMS,
    MOST_GROUP_SIZE,
    MOST_INFLIGHT,
    MOST_MEDIAN_MS,
    MOST_REPEAT,
    MOST_SCENES,
    MOST_SECONDS,
    MOST_STEPS,
    MOST_SYNTHETIC,
    MOST_TASKS,
    MOST_WORKERS,
)
from .stopping import stops_cleanly

__all__ = ["bench_app"]

bench_app = typer.Typer(no_args_is_help=True)
console = Console(stderr=True)


@bench_app.callback()
def _figures_own_stdout(ctx: typer.Context) -> None:
    """stdout carries the figures (``--json``): what the processes a benchmark starts print goes
    to stderr (``own_stdout``), for every benchmark command, until it returns."""
    from troupe.cli.commands.own_stdout import own_stdout

    ctx.with_resource(own_stdout())


JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object with every figure.")]
QuickOption = Annotated[bool, typer.Option("--quick", help="A fifth of the messages: faster, noisier.")]


@bench_app.command("messaging")
@stops_cleanly
def messaging(
    as_json: JsonOption = False,
    quick: QuickOption = False,
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat", min=1, max=MOST_REPEAT, help="Runs per figure, raw and troupe alike (medians)."
        ),
    ] = 5,
    curve: Annotated[
        bool, typer.Option("--curve", help="CURVE on every socket, troupe's and raw pyzmq's alike.")
    ] = False,
) -> None:
    """Tell and ask throughput, startup time and idle memory, against raw pyzmq."""
    from .messaging import measure_messaging  # imported here: `troupe` starts fast

    fig = measure_messaging(
        quick, progress=lambda m: console.print(literal(f"measuring {m}...", "dim")), runs=repeat, curve=curve
    )
    if as_json:
        typer.echo(json.dumps(fig, indent=2))
        return
    both = " with CURVE" if curve else ""
    table = Table(title=f"troupe messaging vs raw pyzmq{both} (same run, medians of {repeat} runs each)")
    for col in (
        "figure",
        "raw ceiling",
        "troupe 2 processes",
        "ratio",
        "troupe 1 process",
        "ratio",
        "asyncio floor",
        "troupe 2 proc. / floor",
    ):
        table.add_column(col, justify="right")
    names = {
        "tell_small": "tell 100 B msgs/s",
        "tell_large": "tell 1 MiB msgs/s",
        "ask1": "ask, 1 outstanding, rt/s",
        "ask64": "ask, 64 outstanding, rt/s",
    }
    for key, label in names.items():
        table.add_row(
            label,
            f"{fig[f'raw_{key}_per_s']:,.0f}",
            f"{fig[f'troupe_{key}_per_s']:,.0f}",
            f"{fig[f'{key}_ratio']:.2f}",
            f"{fig[f'troupe_local_{key}_per_s']:,.0f}",
            f"{fig[f'local_{key}_ratio']:.2f}",
            # Asks only: the floor is an event loop's ask (floor.py); tells have none.
            f"{fig[f'floor_{key}_per_s']:,.0f}" if f"floor_{key}_per_s" in fig else "-",
            f"{fig[f'{key}_floor_ratio']:.2f}" if f"{key}_floor_ratio" in fig else "-",
        )
    Console().print(table)
    Console().print(
        f"startup (node start -> first ask answered): {fig['startup_s']:.2f} s; "
        f"idle memory of {fig['idle_processes']:.0f} processes (node, supervisor, template, worker): "
        f"RSS {fig['idle_rss_mib']:.0f} MiB summed, PSS {fig['idle_pss_mib']:.0f} MiB"
    )


@bench_app.command("pipeline")
@stops_cleanly
def pipeline(
    as_json: JsonOption = False,
    scenes: Annotated[
        int | None,
        typer.Option(
            "--scenes",
            min=1,
            max=MOST_SCENES,
            help="Scenes for the real workload (default 64; with --resolution, by size).",
        ),
    ] = None,
    synthetic: Annotated[
        int, typer.Option("--synthetic", min=1, max=MOST_SYNTHETIC, help="Items for the synthetic workload.")
    ] = 300,
    cpu: Annotated[
        int, typer.Option("--cpu", min=1, max=MOST_CPU_ITEMS, help="Items for the CPU-bound workload.")
    ] = 400,
    resolution: Annotated[
        str | None,
        typer.Option(
            "--resolution",
            metavar="WxH",
            help="Render at this size (e.g. 640x480): the real workload only, with bytes and frames/s.",
        ),
    ] = None,
) -> None:
    """The sequential baseline against the troupe pipeline on the same scenes, the engine's overhead,
    and a CPU-bound workload against the bound of its stages' costs."""
    progress = lambda m: console.print(literal(f"measuring {m}...", "dim"))  # noqa: E731
    if resolution is not None:
        _pipeline_at(resolution, scenes, as_json, progress)
        return
    from .pipeline import measure_pipeline, pipeline_lines

    fig = measure_pipeline(scenes or 64, synthetic, progress=progress, cpu_items=cpu)
    if as_json:
        typer.echo(json.dumps(fig, indent=2))
        return
    for line in pipeline_lines(fig):
        Console().print(literal(line), highlight=False)


def _pipeline_at(resolution: str, scenes: int | None, as_json: bool, progress: Any) -> None:
    """``bench pipeline --resolution``: the real workload alone, at that size."""
    from .pipeline_resolution import IncompleteRun, measure_resolution, parse_resolution, resolution_lines

    try:
        width, height = parse_resolution(resolution)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    try:
        fig = measure_resolution(width, height, scenes, progress=progress)
    except IncompleteRun as exc:
        raise fail(f"bench pipeline --resolution {resolution}: {exc}", 1) from None
    if as_json:
        typer.echo(json.dumps(fig, indent=2))
        return
    for line in resolution_lines(fig):
        Console().print(literal(line), highlight=False)


@bench_app.command("train")
@stops_cleanly
def train(
    as_json: JsonOption = False,
    steps: Annotated[
        int, typer.Option("--steps", min=1, max=MOST_STEPS, help="Measured train steps per mode.")
    ] = 64,
    inflight: Annotated[
        int | None,
        typer.Option(
            "--inflight",
            min=1,
            max=MOST_INFLIGHT,
            help="In-flight depth K (default: try 1, 2, 4, 8, keep the best).",
        ),
    ] = None,
    actors: Annotated[
        int | None,
        typer.Option(
            "--actors",
            min=1,
            max=MOST_ACTORS,
            help="Encoder actors (default: one per core the trainer leaves).",
        ),
    ] = None,
    repeat: Annotated[
        int, typer.Option("--repeat", min=1, max=MOST_REPEAT, help="Rounds of every figure (medians).")
    ] = 3,
    group_size: Annotated[
        int | None,
        typer.Option(
            "--group-size",
            min=1,
            max=MOST_GROUP_SIZE,
            help="Samples per group sent to an encoder actor (default 4).",
        ),
    ] = None,
) -> None:
    """Training with encoding inside the trainer against encoder actors, and the bound of
    encoding alone and training alone on the same cores."""
    from .train import measure_train

    fig = measure_train(
        steps,
        inflight,
        actors,
        progress=lambda m: console.print(literal(f"{m}...", "dim")),
        repeat=repeat,
        group_size=group_size,
    )
    if as_json:
        typer.echo(json.dumps(fig, indent=2))
        return
    table = Table(
        title=f"troupe train: {fig['steps']} steps of {fig['batch_size']} samples, {fig['cores']} cores, "
        f"medians of {fig['repeat']} rounds "
        f"(trainer {fig['trainer_threads']} threads, {fig['actors']} encoder actors of "
        f"{fig['encoder_threads']})"
    )
    for col in ("figure", "samples/s", "vs bound"):
        table.add_column(col, justify="right")
    bound = fig["bound_samples_per_s"]
    table.add_row("encoding inside the trainer", f"{fig['local_samples_per_s']:.1f}",
                  f"{fig['local_samples_per_s'] / bound:.2f}")  # fmt: skip
    for k, rate in fig["remote_samples_per_s_by_inflight"].items():
        table.add_row(f"encoder actors, K={k}", f"{rate:.1f}", f"{rate / bound:.2f}")
    table.add_row("encoding alone", f"{fig['encode_alone_samples_per_s']:.1f}", "-")
    table.add_row("training alone", f"{fig['train_alone_samples_per_s']:.1f}", "-")
    table.add_row("bound (the slower)", f"{bound:.1f}", "1.00")
    Console().print(table)
    Console().print(
        f"remote_vs_bound {fig['remote_vs_bound']:.2f} at K={fig['inflight']}; "
        f"remote_vs_local {fig['remote_vs_local']:.2f}"
    )
    cpu = fig["cpu_ms_per_sample"]
    Console().print(
        f"CPU ms per sample (groups of {fig['group_size']}): trainer {cpu['remote_trainer']:.2f} "
        f"(training alone {cpu['train_alone']:.2f}, beside encoding {cpu['train_together']:.2f}), "
        f"encoder actors {cpu['remote_encoders']:.2f} (encoding alone {cpu['encode_alone']:.2f}, "
        f"beside training {cpu['encode_together']:.2f})"
    )
    switches = fig["gpu_switches"]
    Console().print(
        literal(
            "encoder GPU switches, samples/s: "
            + ", ".join(f"{k} {'failed' if v is None else f'{v:.1f}'}" for k, v in switches.items())
            + f" ({fig['gpu_switches_note']})"
            if switches
            else f"encoder GPU switches: not measured ({fig['gpu_switches_note']})"
        )
    )


@bench_app.command("scale")
@stops_cleanly
def scale(
    workers: Annotated[
        int,
        typer.Option(
            "--workers", min=1, max=MOST_WORKERS, help="Simulated workers (one slot each; 250 per process)."
        ),
    ] = 128,
    tasks: Annotated[int, typer.Option("--tasks", min=1, max=100_000, help="Tasks PER WORKER.")] = 20,
    median_ms: Annotated[
        float | None,
        typer.Option(
            "--median-ms",
            callback=within("milliseconds", MOST_MEDIAN_MS),
            help="Median task duration, ms, at most 60,000 (default 500, 100 above 256 workers).",
        ),
    ] = None,
    prefetch: Annotated[
        int | None,
        typer.Option(
            "--prefetch",
            min=0,
            max=64,
            help="Leases each worker holds ahead (default: a worker's, 1; 0: none).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """One real master, N simulated workers, heavy-tailed tasks: efficiency and dispatch rate."""
    from .scale import JobOutran, measure_scale, scale_table

    if workers * tasks > MOST_TASKS:  # one job: the master's book holds every task
        raise fail(
            f"--workers {workers} x --tasks {tasks} is {workers * tasks:,} tasks; at most "
            f"{MOST_TASKS:,} in one job (as bench submit)",
            2,
        )

    try:
        fig = measure_scale(
            workers,
            tasks,
            median_ms,
            progress=lambda m: console.print(literal(f"{m}...", "dim")),
            prefetch=prefetch,
        )
    except JobOutran as exc:
        if as_json:  # what was measured before, for a script that keeps what it can
            typer.echo(json.dumps({**exc.figures, "incomplete": str(exc)}, indent=2))
        elif "efficiency" in exc.figures:
            console.print(literal(f"speculation on: efficiency {exc.figures['efficiency']:.3f}", "dim"))
        raise fail(str(exc), 1) from None
    if as_json:
        typer.echo(json.dumps(fig, indent=2))
        return
    Console().print(scale_table(fig))


@bench_app.command("submit")
@stops_cleanly
def submit(
    tasks: Annotated[
        int, typer.Option("--tasks", min=1, max=MOST_TASKS, help="Tasks in the one job submitted.")
    ] = 1_000_000,
    as_json: JsonOption = False,
) -> None:
    """One big submit to a real master: its time, and how long the master answered nothing."""
    from .submit import measure_submit, submit_table

    fig = measure_submit(tasks, progress=lambda m: console.print(literal(f"{m}...", "dim")))
    if as_json:
        typer.echo(json.dumps(fig, indent=2))
        return
    Console().print(submit_table(fig))


@bench_app.command("recovery")
@stops_cleanly
def recovery(
    as_json: JsonOption = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval",
            callback=within("seconds", MOST_SECONDS),
            help="Heartbeat interval of the bench node, s.",
        ),
    ] = 0.1,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            callback=within("seconds", MOST_SECONDS),
            help="Heartbeat timeout of the bench node, s.",
        ),
    ] = 0.6,
    repeat: Annotated[
        int, typer.Option("--repeat", min=1, max=MOST_REPEAT, help="Rounds per figure (medians).")
    ] = 3,
) -> None:
    """Kill-to-detect, hang-to-kill and kill-to-serving-again, against a bare process spawn."""
    from pydantic import ValidationError

    from troupe.runtime.node.config import SupervisionConfig

    from .recovery import measure_recovery

    try:  # the bench node's: refused here in one line, not after the first measurement
        SupervisionConfig(interval_s=interval, heartbeat_timeout_s=timeout)
    except ValidationError as exc:
        reason = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise fail(f"--interval {interval:g} / --timeout {timeout:g}: {reason}", 2) from None

    fig = measure_recovery(
        interval, timeout, repeat, progress=lambda m: console.print(literal(f"measuring {m}...", "dim"))
    )
    if as_json:
        typer.echo(json.dumps(fig, indent=2))
        return
    table = Table(
        title=f"troupe recovery (heartbeat every {interval} s, timeout {timeout} s; medians of {repeat})"
    )
    for col in ("figure", "troupe", "floor / bound", "ratio"):
        table.add_column(col, justify="right")
    table.add_row("kill -> detected (waitpid)", f"{fig['kill_detect_s'] * 1000:.1f} ms", "0", "-")
    table.add_row(
        "hang -> killed and reaped",
        f"{fig['hang_kill_s']:.3f} s",
        f"<= {fig['hang_kill_bound_s']:.3f} s",
        f"{fig['hang_kill_s'] / fig['hang_kill_bound_s']:.2f}",
    )
    table.add_row(
        "kill -> serving again",
        f"{fig['restart_serving_s']:.3f} s",
        f"{fig['spawn_floor_s']:.3f} s (bare spawn)",
        f"{fig['restart_serving_over_floor']:.2f}",
    )
    table.add_row(
        "torch worker: kill -> serving (template fork)",
        f"{fig['torch_restart_serving_s']:.3f} s",
        f"{fig['spawn_floor_s']:.3f} s (bare spawn)",
        f"{fig['torch_restart_over_floor']:.2f}",
    )
    table.add_row(
        "torch worker: kill -> serving (spawn)",
        f"{fig['torch_restart_serving_spawn_s']:.3f} s",
        f"{fig['torch_spawn_floor_s']:.3f} s (spawn + torch)",
        f"{fig['torch_restart_serving_spawn_s'] / fig['torch_spawn_floor_s']:.2f}",
    )
    Console().print(table)
