"""``troupe bench messaging``: troupe's messaging against raw pyzmq, in one run.

Every troupe figure is printed as a ratio to its raw ceiling measured in the same run, with
the same payloads, process boundary and TCP loopback transport. The asks are also measured
against the asyncio floor (floor.py: a bare uvloop + pyzmq ask, which pays an event loop's
wake-ups as troupe does and blocking pyzmq does not): ``ask1_floor_ratio`` and
``ask64_floor_ratio``. With ``curve``, every side authenticates and encrypts with CURVE: troupe
with keys generated for the run (node, workers and this client), raw pyzmq and the floor with
CURVE on their sockets.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any

import anyio
import psutil

from troupe.runtime.core.client import connect
from troupe.runtime.errors import TroupeError
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.config import ActorSpec, NodeConfig, WorkerSpec
from troupe.runtime.node.local import start_local_node
from troupe.runtime.security.keys import generate_keys, load_keys
from troupe.runtime.transports.loopback import free_endpoint

from . import bench_children
from .floor import floor_echo_round_trips
from .raw import CurvePairs, raw_echo_round_trips, raw_one_way, run_apart
from .stopping import bench_folder

__all__ = ["bench_keys", "measure_messaging", "measure_startup"]

# Round trips with one outstanding, --quick or not. On this project's VMs the first ~0.1 s of
# any ping-pong runs about twice as fast (the idle vCPU still polls before it halts), so a
# shorter run measures that window rather than the steady state: raw 22k/s over 1,600 round
# trips, 11k/s over 8,000.
N_ASK1 = 8_000

STARTUP_LIMIT_S = 60.0  # a node not answering by then has failed to start
NODE_STOP_S = 15.0  # for a node stopping (told to, or SIGTERMed) before it is SIGKILLed


def _bench_workers() -> tuple[WorkerSpec, ...]:
    return (
        WorkerSpec(
            name="src",
            actors=(
                ActorSpec(name="source", cls="troupe.cli.bench.actors:Source"),
                ActorSpec(name="sink_local", cls="troupe.cli.bench.actors:Sink"),
            ),
        ),
        WorkerSpec(name="dst", actors=(ActorSpec(name="sink", cls="troupe.cli.bench.actors:Sink"),)),
    )


Measure = Callable[[], float]


def _plan(
    n_small: int, n_large: int, n_ask: int, curve: CurvePairs | None = None
) -> list[tuple[str, Measure, Measure | None, str, dict[str, Any]]]:
    """Each figure: its key, the raw measurement, the asyncio floor's (asks only), and the
    Source request that measures troupe."""
    return [
        (
            "tell_small",
            partial(raw_one_way, n_small, "small", curve),
            None,
            "tells",
            {"n": n_small, "kind": "small"},
        ),
        (
            "tell_large",
            partial(raw_one_way, n_large, "large", curve),
            None,
            "tells",
            {"n": n_large, "kind": "large"},
        ),
        (
            "ask1",
            partial(raw_echo_round_trips, N_ASK1, 1, "small", curve),
            partial(floor_echo_round_trips, N_ASK1, 1, "small", curve),
            "asks",
            {"n": N_ASK1, "window": 1, "kind": "small"},
        ),
        (
            "ask64",
            partial(raw_echo_round_trips, n_ask, 64, "small", curve),
            partial(floor_echo_round_trips, n_ask, 64, "small", curve),
            "asks",
            {"n": n_ask, "window": 64, "kind": "small"},
        ),
    ]


def bench_keys(directory: Path) -> tuple[Path, CurvePairs]:
    """Keys for a CURVE run: a keys directory for troupe, and pairs for the raw sockets."""
    keys = directory / "keys"
    generate_keys(keys)
    cluster, operator = load_keys(keys), load_keys(keys, "operator")
    return keys, (cluster.public, cluster.secret, operator.public, operator.secret)


async def _figures(
    n_small: int,
    n_large: int,
    n_ask: int,
    runs: int,
    log_dir: Path,
    say: Any,
    curve: tuple[Path, CurvePairs] | None = None,
) -> dict[str, float]:
    """Raw (and floor) and troupe runs of each figure, taken in turn (raw, floor, troupe, raw,
    ...) so that a slow spell of the machine falls on every side of a ratio; medians of
    ``runs`` each."""
    cfg = NodeConfig(
        name="bench",
        endpoint=free_endpoint(),
        log_dir=log_dir,
        log_level="warning",
        workers=_bench_workers(),
        keys=curve[0] if curve else None,  # the node installs them: this client uses them too
    )
    raw_curve = curve[1] if curve else None
    out: dict[str, float] = {}
    async with anyio.create_task_group() as tg:
        node = await start_local_node(tg, cfg)
        async with connect(cfg.endpoint, "bench") as rt:
            source = rt.ref("src/source")

            async def troupe_run(request: str, spec: dict[str, Any]) -> float:
                return float(await source.ask(request, spec, timeout=600))

            async def warm_up(request: str, spec: dict[str, Any]) -> None:
                # A tenth-size run first, unmeasured: the processes stay up between runs, and the
                # first run of a new payload size pays for growing their allocator's pools.
                await troupe_run(request, {**spec, "n": max(64, spec["n"] // 10)})

            for key, raw_run, floor_run, request, spec in _plan(n_small, n_large, n_ask, raw_curve):
                # 1 MiB messages are bound by memory copies, and both sides' runs scatter about
                # twice as widely as the others' (raw from 5k to 9k/s here): twice the runs.
                n_runs = 2 * runs - 1 if key == "tell_large" else runs
                sides = "raw pyzmq, the asyncio floor and troupe" if floor_run else "raw pyzmq and troupe"
                say(f"{key}: {sides} in turn, {n_runs} runs each")
                two_processes = {**spec, "target": "dst/sink"}
                await warm_up(request, two_processes)
                raw, floor, troupe = [], [], []
                for _ in range(n_runs):
                    raw.append(await anyio.to_thread.run_sync(run_apart, raw_run))
                    if floor_run is not None:
                        floor.append(await anyio.to_thread.run_sync(run_apart, floor_run))
                    troupe.append(await troupe_run(request, two_processes))
                out[f"raw_{key}_per_s"] = median(raw)
                if floor:
                    out[f"floor_{key}_per_s"] = median(floor)
                out[f"troupe_{key}_per_s"] = median(troupe)
            for key, _, _, request, spec in _plan(n_small, n_large, n_ask, raw_curve):
                say(f"{key}: troupe, both actors in one process")
                one_process = {**spec, "target": "sink_local"}
                await warm_up(request, one_process)
                out[f"troupe_local_{key}_per_s"] = median(
                    [await troupe_run(request, one_process) for _ in range(runs)]
                )
        node.stopping.set()
    return out


def _node_command(config: Path, endpoint: str, log_dir: Path, keys: Path | None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "troupe.cli.main",
        "node",
        "start",
        "--config",
        str(config),
        "--endpoint",
        endpoint,
        "--logs",
        str(log_dir),
        "--log-level",
        "warning",
        *(["--keys", str(keys)] if keys else []),
    ]


async def measure_startup(log_dir: Path, keys: Path | None = None) -> dict[str, float | int]:
    """Seconds from `troupe node start` to a first actor answering, and idle RSS of it all
    (with ``keys``: a node with CURVE keys, asked by this process with the keys it installed).

    The node dies with this process (``bench_children``). Stopped or failed midway, the node is
    SIGTERMed at once: it stops as on any SIGTERM, its children with it; only the measurement
    that went through tells it to shut down over its control socket.
    """
    endpoint = free_endpoint()
    config = log_dir / "startup-node.toml"
    config.write_text(
        '[node]\nname = "startup"\n\n[[workers]]\nname = "w0"\n'
        'actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]\n'
    )
    t0 = time.perf_counter()
    proc = bench_children.start(
        _node_command(config, endpoint, log_dir, keys), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    told_to_stop = False
    try:
        async with connect(endpoint, "startup") as rt:
            with anyio.fail_after(STARTUP_LIMIT_S):
                # Asked of the node itself, each call waiting for its answer: an ask's lookup
                # gives up after 5 s, and a "no running actor" answer that came after it was
                # logged, unclaimed, on this process's stderr.
                while True:
                    try:
                        await rt.control(endpoint, "resolve", {"address": "echo"}, timeout=STARTUP_LIMIT_S)
                        break
                    except TroupeError:  # not up yet: the node or its worker is still starting
                        await anyio.sleep(0.01)
                await rt.ref("echo").ask("echo", 1, timeout=STARTUP_LIMIT_S)
            startup = time.perf_counter() - t0
            await anyio.sleep(1.0)  # let start-up garbage settle before calling it idle
            root = psutil.Process(proc.pid)
            procs = [root, *root.children(recursive=True)]
            mem = [p.memory_full_info() for p in procs]
            rss = sum(m.rss for m in mem) / 2**20
            # RSS counts the pages of shared libraries once per process; PSS splits them between
            # the processes sharing them, so its sum is the memory the processes really hold.
            pss = sum(m.pss for m in mem) / 2**20
            await rt.control(endpoint, "shutdown")
            told_to_stop = True
    finally:
        if not told_to_stop and proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=NODE_STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return {
        "startup_s": startup,
        "idle_rss_mib": rss,
        "idle_pss_mib": pss,
        "idle_processes": len(procs),  # a count: an int in the JSON, as "runs" is
    }


def measure_messaging(
    quick: bool = False, progress: Any = None, runs: int = 5, curve: bool = False
) -> dict[str, float | int | bool]:
    """Run every measurement and return one flat dict of figures and ratios.

    Each throughput, raw and troupe alike, is the median of ``runs`` runs, taken in turn, so
    that one run slowed (or sped up) by the rest of a shared machine does not decide a ratio.
    With ``curve``, every socket of both sides uses CURVE (``"curve": true`` in the figures).
    Counts are ints and ``curve`` a bool, as ``--json`` prints them: ``"curve": 0.0`` was true
    to jq, and a typed reader expecting an int got a float.
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    scale = 0.2 if quick else 1.0
    n_small, n_large, n_ask = int(200_000 * scale), int(2_000 * scale), int(64_000 * scale)
    say = progress or (lambda _msg: None)
    fig: dict[str, float | int | bool] = {"runs": runs, "curve": curve}
    with bench_folder("troupe-bench-") as tmp:
        # Only errors would be news: a warning of this process went to stderr as a raw dict.
        configure_logging("bench", "bench", None, console=False, level="error")
        keys = bench_keys(Path(tmp)) if curve else None
        fig.update(
            anyio.run(
                _figures,
                n_small,
                n_large,
                n_ask,
                runs,
                Path(tmp),
                say,
                keys,
                backend="asyncio",
                backend_options={"use_uvloop": True},
            )
        )
        say("startup and idle memory")
        fig.update(
            anyio.run(
                measure_startup,
                Path(tmp),
                keys[0] if keys else None,
                backend="asyncio",
                backend_options={"use_uvloop": True},
            )
        )
    for key in ("tell_small", "tell_large", "ask1", "ask64"):
        fig[f"{key}_ratio"] = fig[f"troupe_{key}_per_s"] / fig[f"raw_{key}_per_s"]
        fig[f"local_{key}_ratio"] = fig[f"troupe_local_{key}_per_s"] / fig[f"raw_{key}_per_s"]
    for key in ("ask1", "ask64"):
        fig[f"{key}_floor_ratio"] = fig[f"troupe_{key}_per_s"] / fig[f"floor_{key}_per_s"]
    return fig
