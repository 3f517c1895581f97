"""``troupe bench scale``: one real master, many simulated workers, heavy-tailed tasks.

The master is a real ``troupe master start`` process with a real journal. The workers are
real :class:`~troupe.runtime.tasks.getter.TaskGetter` objects speaking the real protocol over
loopback, hundreds per process (one runtime per process, one asyncio task per worker), so a
thousand of them fit on two cores. A simulated worker "runs" a task by sleeping its duration.

Durations: lognormal with median ``median_ms`` and sigma 0.5, and 5% stragglers that take 10x
as long. The first copy of a task has a duration fixed by its seed, the same in every run; a
backup copy draws its own straggler chance (a straggler is a slow host, not a slow task).

Figures, each for a job with speculative tails (the default) and one without:
makespan (job submitted -> last task done, on the master's clock), ideal makespan (the first
copies' total work / workers), efficiency (ideal / makespan; with speculation it can pass 1
on a small job, where a backup copy ends a straggler sooner than the first copy whose time the
ideal counts), dispatches per second (leases granted, backups included, / makespan), master
CPU seconds per 1,000 tasks (psutil), the seconds per 1,000 tasks its garbage collector stopped
it (``master_gc_s_per_1k``, from its status; see runtime/gc_pauses.py) and its longest such pause
since it started (``master_gc_longest_ms``), and the master's group commit: events per journal
batch and milliseconds per append (its thread's wall time, the fsync included: the latency every
reply of the batch waits).

Each simulated worker holds ``prefetch`` leases ahead of its slot (``--prefetch``; by default
a worker's own default, ``GetterConfig.prefetch``, 1): the figure ``prefetch`` says which. The workers'
own counters, summed over both jobs, come as ``worker_*``: requests they made on their own,
copies started, leases ahead given back, renew messages, and the CPU milliseconds their
processes used (``worker_cpu_ms``: on a two-core machine they share the CPU with the master).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import NormalDist
from typing import Any

import anyio
import psutil
from rich.table import Table

from troupe.cli.master_client import master_call
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.errors import ActorStopped, Unreachable
from troupe.runtime.logs import configure_logging
from troupe.runtime.tasks.getter import TaskGetter
from troupe.runtime.tasks.getter_config import GetterConfig
from troupe.runtime.tasks.getter_start import install_task_control
from troupe.runtime.tasks.master.controls import MAX_WAIT_JOB_S
from troupe.runtime.tasks.task_actor import LeasedTask
from troupe.runtime.transports.loopback import free_endpoint

from . import bench_children

__all__ = ["measure_scale", "reap", "scale_table", "start_master", "task_duration"]

SIGMA = 0.5
STRAGGLER_P = 0.05
STRAGGLER_X = 10.0
SIM_ENV = "TROUPE_SIM_SPEC"
PER_PROCESS = 250  # simulated workers per process


_DEFAULT_PREFETCH = GetterConfig("", "").prefetch  # what a real worker holds ahead unless told
_NORMAL = NormalDist()
_MASK64 = (1 << 64) - 1


def _uniform(key: int) -> float:
    """A number in (0, 1) fixed by ``key`` (splitmix64): a tenth of the cost of seeding a
    ``random.Random``, which the simulated workers would otherwise pay for every task, on the
    CPU they share with the master."""
    x = (key + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return ((x >> 11) + 0.5) / float(1 << 53)


def task_duration(seed: int, backup: bool, lease_id: int, median_s: float) -> float:
    """Seconds a copy of task ``seed`` runs: lognormal base, 5% chance of 10x.

    The first copy's straggler draw depends on the seed only (the same in every run); a
    backup copy draws again, keyed by its lease.
    """
    base = median_s * math.exp(SIGMA * _NORMAL.inv_cdf(_uniform(seed * 2)))
    key = seed * 1_000_003 + (lease_id * 7 + 1 if backup else 0)
    return base * (STRAGGLER_X if _uniform(key * 2 + 1) < STRAGGLER_P else 1.0)


# --------------------------------------------------------------------------- simulated workers


async def _simulate(spec: dict[str, Any]) -> None:
    median_s = float(spec["median_s"])

    async def runner(task: LeasedTask) -> str | None:
        # asyncio's own sleep: anyio's looks the backend up on every call, CPU the simulated
        # workers would take from the master they share the machine with
        await asyncio.sleep(task_duration(task.seed, task.backup, task.lease_id, median_s))
        return None

    runtime = process_runtime(spec["node"], spec["process"], hwm=1_000_000, drain_timeout=0.1)
    getters: dict[str, TaskGetter] = {}
    async with runtime:
        install_task_control(runtime, getters)
        for worker_id in spec["workers"]:
            config = GetterConfig(
                worker_id, spec["node"], wait_s=2.0, call_timeout_s=60.0, prefetch=spec["prefetch"]
            )
            getters[worker_id] = TaskGetter(runtime, spec["master"], config, runner)
            runtime.start_soon(getters[worker_id].run)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        totals: dict[str, int] = {}
        for getter in getters.values():
            for key, value in dataclasses.asdict(getter.statistics()).items():
                totals[key] = totals.get(key, 0) + value
        totals["cpu_ms"] = round(time.process_time() * 1000)
        Path(spec["stats"]).write_text(json.dumps(totals))


def _sim_main() -> None:
    spec = json.loads(os.environ[SIM_ENV])
    configure_logging(spec["node"], spec["process"], None, console=False, level="error")
    anyio.run(_simulate, spec, backend="asyncio", backend_options={"use_uvloop": True})


# --------------------------------------------------------------------------- the driver


def _job(name: str, tasks: int, speculation: bool) -> dict[str, Any]:
    return {
        "source": "bench scale",
        "job": {
            "job": {
                "name": name,
                "kind": "sim",
                "count": tasks,
                "lease_s": 600,
                "max_attempts": 3,
                "speculation": {"enabled": speculation, "factor": 1.5, "min_runtime_s": 0.0, "max_copies": 2},
            }
        },
    }


async def _wait_workers(master: str, n: int, timeout: float) -> None:
    with anyio.fail_after(timeout):
        while True:  # a bounded poll: the master starts, then the workers register
            try:
                if len((await master_call(master, "status", None, 30.0))["workers"]) >= n:
                    return
            except (Unreachable, ActorStopped):  # not bound yet, or still starting
                pass
            await anyio.sleep(0.2)


class JobOutran(RuntimeError):
    """A bench job not done within its wait (a machine many times slower than the job's ideal
    makespan): one line with its progress, and the figures of the jobs that did finish
    (``figures``, set by :func:`measure_scale`). It was a traceback, every figure lost (report
    i14 1)."""

    def __init__(self, name: str, state: str, counts: dict[str, Any], wait_s: float, tasks: int) -> None:
        done = int(counts.get("done", 0))
        super().__init__(
            f"bench job {name} was {state}, not done, after its wait of {wait_s:.0f} s (the ideal "
            f"makespan x 6 + 120 s): {done:,} of {tasks:,} tasks done, {counts.get('pending', 0):,} "
            f"pending, {counts.get('leased', 0):,} leased; this machine runs it far slower than its "
            "ideal (other load on it?): fewer --workers or --tasks, or a quieter machine"
        )
        self.figures: dict[str, Any] = {}


async def _run_job(
    master: str, master_pid: int, name: str, tasks: int, speculation: bool, timeout: float
) -> dict[str, Any]:
    proc = psutil.Process(master_pid)
    before = await master_call(master, "status", None, 30.0)
    cpu0 = sum(proc.cpu_times()[:2])
    await master_call(master, "submit", _job(name, tasks, speculation), 120.0)
    wait_s = min(timeout, MAX_WAIT_JOB_S)  # the master waits a day at most
    job = await master_call(master, "wait_job", {"job_id": name, "timeout_s": wait_s}, wait_s + 30)
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    after = await master_call(master, "status", None, 30.0)
    if job["state"] != "done":
        raise JobOutran(name, job["state"], job["counts"], wait_s, tasks)
    makespan = job["finished_at"] - job["started_at"]
    backups = after["speculative"]["launched"] - before["speculative"]["launched"]
    driver = {key: after["driver"][key] - before["driver"][key] for key in ("events", "batches", "append_s")}
    batches = max(driver["batches"], 1)
    return {
        "makespan_s": makespan,
        "dispatch_per_s": (tasks + backups) / makespan,
        "master_cpu_s_per_1k": cpu / tasks * 1000.0,
        "master_gc_s_per_1k": (after["gc"]["pause_s"] - before["gc"]["pause_s"]) / tasks * 1000.0,
        "master_gc_longest_ms": after["gc"]["longest_pause_s"] * 1000.0,
        "backups_launched": backups,
        "backups_won": after["speculative"]["won"] - before["speculative"]["won"],
        "events_per_batch": driver["events"] / batches,
        "append_ms_per_batch": driver["append_s"] / batches * 1000.0,
    }


def start_master(tmp: Path, endpoint: str) -> subprocess.Popen[bytes]:
    """A ``troupe master start`` on a new journal in ``tmp``; it dies with this process."""
    return bench_children.start(
        [
            sys.executable,
            "-m",
            "troupe.cli.main",
            "master",
            "start",
            "--journal",
            str(tmp / "journal.db"),
            "--new",
            "--endpoint",
            endpoint,
            "--logs",
            str(tmp / "logs"),
            "--log-level",
            "warning",
            "--node-timeout",
            "3600",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _start_sims(
    endpoint: str, workers: int, median_s: float, prefetch: int, tmp: Path
) -> list[subprocess.Popen[bytes]]:
    procs = []
    count = max(1, math.ceil(workers / PER_PROCESS))
    for k in range(count):
        ids = [f"sim{k}/w{i}" for i in range(k, workers, count)]
        spec = {
            "master": endpoint,
            "node": f"sim{k}",
            "process": f"sim{k}",
            "workers": ids,
            "median_s": median_s,
            "prefetch": prefetch,
            "stats": str(tmp / f"sim{k}.json"),
        }
        procs.append(
            bench_children.start(
                [sys.executable, "-m", "troupe.cli.bench.scale"],
                env={**os.environ, SIM_ENV: json.dumps(spec)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return procs


def reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def measure_scale(
    workers: int,
    tasks_per_worker: int,
    median_ms: float | None = None,
    progress: Callable[[str], None] | None = None,
    prefetch: int | None = None,
) -> dict[str, Any]:
    """Run the benchmark and return its figures (see the module docstring).

    Args:
        workers: simulated workers, one slot each.
        tasks_per_worker: tasks per worker; the job has ``workers * tasks_per_worker``.
        median_ms: median task duration; default 500 ms up to 256 workers and 100 ms above,
            so that a thousand workers ask for more dispatches than the master can give.
        progress: called with a line before each phase.
        prefetch: leases each simulated worker holds ahead of its slot; None: a worker's
            default (``GetterConfig.prefetch``).
    """
    say = progress or (lambda _msg: None)
    if prefetch is None:
        prefetch = _DEFAULT_PREFETCH
    median_ms = median_ms or (500.0 if workers <= 256 else 100.0)
    median_s = median_ms / 1000.0
    tasks = workers * tasks_per_worker
    ideal = sum(task_duration(seed, False, 0, median_s) for seed in range(tasks)) / workers
    fig: dict[str, Any] = {
        "workers": workers,
        "tasks": tasks,
        "tasks_per_worker": tasks_per_worker,
        "median_ms": median_ms,
        "prefetch": prefetch,
        "ideal_makespan_s": ideal,
    }
    endpoint = free_endpoint()
    with tempfile.TemporaryDirectory(prefix="troupe-scale-") as tmp:
        master = start_master(Path(tmp), endpoint)
        sims: list[subprocess.Popen[bytes]] = []
        try:
            sims = _start_sims(endpoint, workers, median_s, prefetch, Path(tmp))
            say(f"{len(sims)} processes of simulated workers registering")
            anyio.run(
                _wait_workers,
                endpoint,
                workers,
                120.0,
                backend="asyncio",
                backend_options={"use_uvloop": True},
            )
            for label, spec in (("", True), ("_no_speculation", False)):
                say(f"job of {tasks:,} tasks, speculation {'on' if spec else 'off'}")
                timeout = ideal * 6 + 120
                try:
                    out = anyio.run(
                        _run_job,
                        endpoint,
                        master.pid,
                        f"scale{label or '_spec'}",
                        tasks,
                        spec,
                        timeout,
                        backend="asyncio",
                        backend_options={"use_uvloop": True},
                    )
                except JobOutran as exc:
                    exc.figures = fig
                    raise
                for key, value in out.items():
                    fig[key + label] = value
                fig["efficiency" + label] = ideal / out["makespan_s"]
        finally:
            reap([*sims, master])
        fig.update(_worker_totals(Path(tmp), len(sims)))
    return fig


def _worker_totals(tmp: Path, sims: int) -> dict[str, int]:
    """The simulated workers' own counters, summed over both jobs (``worker_`` figures)."""
    totals: dict[str, int] = {}
    for k in range(sims):
        try:
            counts = json.loads((tmp / f"sim{k}.json").read_text())
        except (OSError, ValueError):  # a process that did not stop cleanly: its counts are lost
            continue
        for key in ("requests", "started", "given_back", "withdrawn", "cancelled", "renewals", "cpu_ms"):
            totals["worker_" + key] = totals.get("worker_" + key, 0) + int(counts.get(key, 0))
    return totals


def scale_table(fig: dict[str, Any]) -> Table:
    """Render the figures: one row with speculative tails, one without."""
    table = Table(
        title=(
            f"troupe bench scale: {fig['workers']:,} workers x "
            f"{fig['tasks_per_worker']} tasks ({fig['tasks']:,}); lognormal median "
            f"{fig['median_ms']:.0f} ms, sigma {SIGMA}, {STRAGGLER_P:.0%} stragglers "
            f"x{STRAGGLER_X:.0f}; prefetch {fig.get('prefetch', 0)}"
        )
    )
    for col in (
        "tails",
        "makespan s",
        "ideal s",
        "efficiency",
        "dispatch/s",
        "master CPU/1k",
        "GC/1k",
        "backups (won)",
        "batch (ms)",
    ):
        table.add_column(col, justify="right")
    for label, name in (("", "speculative"), ("_no_speculation", "none")):
        table.add_row(
            name,
            f"{fig['makespan_s' + label]:.2f}",
            f"{fig['ideal_makespan_s']:.2f}",
            f"{fig['efficiency' + label]:.3f}",
            f"{fig['dispatch_per_s' + label]:,.0f}",
            f"{fig['master_cpu_s_per_1k' + label]:.3f}",
            f"{fig['master_gc_s_per_1k' + label]:.3f}",
            f"{fig['backups_launched' + label]} ({fig['backups_won' + label]})",
            f"{fig['events_per_batch' + label]:.1f} ({fig['append_ms_per_batch' + label]:.1f})",
        )
    return table


if __name__ == "__main__":
    _sim_main()
