"""``troupe run`` (the main job) and ``troupe demo`` (actors exchanging messages)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import anyio
import typer
from rich.console import Console

from troupe.cli.client import run_async
from troupe.cli.literal import literal, markup
from troupe.runtime.core.client import connect
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.config import (
    RUN_MASTER_ENDPOINT,
    RUN_NODE_ENDPOINT,
    ActorSpec,
    NodeConfig,
    WorkerSpec,
)
from troupe.runtime.node.local import start_local_node

from .keys_option import keys_directory
from .moved_endpoint import moved_note

__all__ = ["demo", "run"]

console = Console(soft_wrap=True)  # the demo's lines: whole when piped, never wrapped at column 80


def demo_workers() -> tuple[WorkerSpec, ...]:
    """Three worker processes: an echo, a greeter with a counter, and a relay."""
    return (
        WorkerSpec(name="w-echo", actors=(ActorSpec(name="echo", cls="troupe.actors.demo.actors:Echo"),)),
        WorkerSpec(
            name="w-greet",
            actors=(
                ActorSpec(
                    name="greeter", cls="troupe.actors.demo.actors:Greeter", kwargs={"greeting": "hello"}
                ),
                ActorSpec(name="counter", cls="troupe.actors.demo.actors:Counter"),
            ),
        ),
        WorkerSpec(name="w-relay", actors=(ActorSpec(name="relay", cls="troupe.actors.demo.actors:Relay"),)),
    )


async def _demo(log_dir: Path, endpoint: str) -> None:
    cfg = NodeConfig(name="local", endpoint=endpoint, log_dir=log_dir, workers=demo_workers())
    configure_logging(cfg.name, "node", cfg.log_dir, console=False, rotate_at_bytes=cfg.log_max_bytes)
    async with anyio.create_task_group() as tg:
        t0 = time.perf_counter()
        node = await start_local_node(tg, cfg)
        console.print(
            markup(
                f"node [bold]local[/] up with {len(node.workers)} worker processes ",
                literal(f"in {time.perf_counter() - t0:.2f} s (logs: {log_dir}/local.jsonl)"),
            )
        )
        async with connect(node.runtime.address, "local", env_keys=False) as rt:  # type: ignore[union-attr]
            greeting = await rt.ref("greeter").ask("greet", "troupe")
            console.print(f"ask greeter/greet -> {greeting!r}")
            counter = rt.ref("counter")
            for _ in range(100):
                await counter.tell("add", 1)
            console.print(f"100 x tell counter/add, then ask counter/get -> {await counter.ask('get')}")
            import numpy as np

            arr = np.arange(1_000_000, dtype=np.float64)
            total = await rt.ref("echo").ask("sum", arr)
            console.print(f"ask echo/sum of a {arr.nbytes // 2**20} MiB array -> {total}")
            console.print(
                f"ask relay/relay (relay asks echo) -> {await rt.ref('relay').ask('relay', {'hops': 2})!r}"
            )
            try:
                await rt.ref("echo").ask("fail", "on purpose")
            except Exception as exc:  # the demo shows what a remote error looks like
                console.print(literal(f"ask echo/fail -> {type(exc).__name__}: {exc}"))
        node.stopping.set()
    console.print("node stopped; every worker exited")


def demo(
    log_dir: Annotated[Path, typer.Option("--logs", help="Logs directory.")] = Path("logs"),
    endpoint: Annotated[str, typer.Option(help="Node endpoint.")] = RUN_NODE_ENDPOINT,
) -> None:
    """Start a one-host node with a few actors and show them exchanging messages."""
    from troupe.cli.preflight import check_demo

    check_demo(log_dir, endpoint)
    run_async(_demo, log_dir, endpoint)


def run(
    config: Annotated[
        Path | None,
        typer.Argument(
            metavar="PIPELINE.toml",
            help="Pipeline TOML (default: the embedded data generation pipeline), or a training TOML.",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("troupe-out"),
    items: Annotated[
        int | None,
        typer.Option("--items", "-n", help="Items to run (default: the pipeline's `items`; 64 by default)."),
    ] = None,
    scenes: Annotated[
        int | None, typer.Option("--scenes", help="The data generation word for --items.", hidden=True)
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(
            help=f"Node endpoint (default {RUN_NODE_ENDPOINT}, or a free port when another "
            "troupe holds that one); a training config with --master starts no node, and does "
            "not use it. With --cluster: where this run listens for its master (a cancel; PORT "
            "may be *), default this host's address towards the master (off loopback with the "
            "cluster pair only)."
        ),
    ] = None,
    master: Annotated[
        str | None,
        typer.Option(
            help=f"Endpoint of the master this run starts (default {RUN_MASTER_ENDPOINT}, or a free "
            "port when another troupe holds that one); with a training config: a running master "
            "whose nodes run the training."
        ),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option("--steps", help="Training steps (a training config only; default: its train.steps)."),
    ] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Delete what troupe wrote in --out, then start anew.")
    ] = False,
    retry_dead: Annotated[
        bool,
        typer.Option(
            "--retry-dead",
            help="Run again the items an earlier run left dead (their attempts used up: a full disk, "
            "a bug since fixed), their attempts counted anew; the rest resumes as always.",
        ),
    ] = False,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            help="A running master: its live nodes run the replicas, placed by the stages' resources "
            "(no node or master is started here); the items are its job named like the pipeline.",
        ),
    ] = None,
    nodes: Annotated[
        int,
        typer.Option("--nodes", help="With --cluster: wait up to a minute until this many nodes are alive."),
    ] = 0,
    keys: Annotated[
        Path | None,
        typer.Option(
            "--keys",
            help="With --cluster, or --master and a training config: the cluster's CURVE keys "
            "directory (or $TROUPE_KEYS).",
            parser=keys_directory,
            metavar="DIR",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the run's metrics as one JSON object, no progress.")
    ] = False,
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            metavar="HOST:PORT",
            help="Serve Prometheus metrics there while the run runs: its node's and the pipeline's "
            "(with --cluster: the pipeline's, from this process); on loopback, or with --cluster "
            "and keys off it.",
        ),
    ] = None,
) -> None:
    """Run a pipeline to the end on a one-host cluster, into --out (default: the data generation
    pipeline, which writes a LeRobot dataset); a training config (configs/train.toml; `troupe
    configs train.toml` writes it there from the install) trains.

    Run again into the same --out, it resumes: committed outputs are kept, the missing items run,
    and the stages finalise once; a finished run says so and exits 0.
    """  # the help flows each paragraph to the terminal's width (main.flowing)
    from troupe.cli.client import fail
    from troupe.cli.preflight import check_cluster_run, check_run, default_or_free
    from troupe.cli.unwritable_output import drop_unwritable_output

    from .own_stdout import own_stdout
    from .run_pipeline import Cluster, finish_run
    from .run_train import config_problem, finish_train, is_train_config

    # The run's product is what it writes into --out: an output that cannot be written (a full
    # disk under ``> run.log``) must not stop it, only be said at its end.
    drop_unwritable_output(": the run went on without it; run the same command again to see where it stands")

    if items is not None and scenes is not None and items != scenes:
        raise fail(f"--items {items} and --scenes {scenes} disagree; give one", 2)
    count = items if items is not None else scenes
    if fresh and retry_dead:
        from troupe.runtime.pipeline.run_plan import BOTH_FRESH_AND_RETRY

        raise fail(BOTH_FRESH_AND_RETRY, 2)
    flag = "--scenes" if items is None and scenes is not None else "--items"  # a way out names --items
    if config is not None and is_train_config(config):
        if retry_dead:
            raise fail("--retry-dead: a training run has no items to retry (it resumes its checkpoint)", 2)
        if metrics is not None:
            raise fail(
                "--metrics: a training run serves none of its own; start its nodes with "
                "`troupe node start --metrics HOST:PORT` and train on them with --master",
                2,
            )
        if cluster is not None or nodes:
            given = "--cluster" if cluster is not None else "--nodes"
            raise fail(
                f"{given}: a training run does not take it (it runs pipelines on a cluster); "
                "train on a running cluster with --master MASTER",
                2,
            )
        if keys is not None and master is None:
            raise fail(
                "--keys: a training run on this host starts a node of its own, without keys; "
                "give --keys with --master MASTER, to train on that cluster",
                2,
            )
        keys = keys or (Path(os.environ["TROUPE_KEYS"]) if master and os.environ.get("TROUPE_KEYS") else None)
        with own_stdout():  # stdout is the report's (--json); what the processes print goes to stderr
            finish_train(
                config, out, steps, count, endpoint, master, fresh, as_json, RUN_NODE_ENDPOINT, flag, keys
            )
        return
    if steps is not None:
        problem = config_problem(config) if config is not None else None
        raise fail(problem or f"--steps {steps}: only a training config (with a [train] table) takes it", 2)
    if cluster is None and (nodes or keys is not None):
        raise fail(f"{'--nodes' if nodes else '--keys'} goes with --cluster MASTER", 2)
    if cluster is not None:
        if master is not None:
            raise fail("--cluster runs on that master: give it without --master", 2)
        if nodes < 0:
            raise fail(f"--nodes must be >= 0, got {nodes}", 2)
        keys = keys or (Path(os.environ["TROUPE_KEYS"]) if os.environ.get("TROUPE_KEYS") else None)
        check_cluster_run(config, out, count, cluster, flag, metrics, keys, endpoint)
        with own_stdout():
            on = Cluster(cluster, nodes, keys, endpoint)
            finish_run(config, out, count, "", "", fresh, as_json, on, retry_dead=retry_dead, metrics=metrics)
        return
    # Defaults another troupe holds (a second run at once) give way to free ports, said on
    # stderr (stdout may carry --json); an endpoint that was given and is taken is refused.
    node_endpoint, node_moved = default_or_free(endpoint, RUN_NODE_ENDPOINT)
    master_endpoint, master_moved = default_or_free(master, RUN_MASTER_ENDPOINT)
    if node_endpoint == master_endpoint:  # the master bound it first: "another node" said the error
        whose = "--master" if master is not None else f"the master's default ({RUN_MASTER_ENDPOINT})"
        raise fail(
            f"--endpoint {node_endpoint} is also {whose}: the run's node and master need a port each; "
            "give --endpoint another port (or --master)",
            2,
        )
    check_run(config, out, count, node_endpoint, master_endpoint, flag, metrics, fresh, retry_dead)
    taken_note = moved_note(node_endpoint, node_moved, master_endpoint, master_moved)
    # Found free just now; one taken by the time the run binds it moves too (two runs at once):
    # the master's also where only --endpoint was given (two tests' runs at once failed on it).
    defaults = endpoint is None and master is None
    with own_stdout():
        finish_run(
            config,
            out,
            count,
            node_endpoint,
            master_endpoint,
            fresh,
            as_json,
            defaults=defaults,
            moved=taken_note,
            retry_dead=retry_dead,
            metrics=metrics,
            master_default=master is None,
        )
