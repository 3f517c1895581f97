"""``troupe bench submit``: what one big submit costs a real master, and how long it holds it.

A real ``troupe master start`` process with a real journal (on this machine's disk) takes one
job of ``--tasks`` tasks. While the submit is in flight, two probes call the master back to
back, each from its own connection, 20 ms apart:

- ``ping`` is answered by the master's event loop: its round trip is how long the loop was held
  (node heartbeats, status, every control wait that long too);
- ``cancel`` of a job that does not exist goes through the master's dispatcher, as every
  worker's lease request does: its round trip is how long the dispatcher was held (a worker
  asking for its next task waits that long).

Figures: ``tasks``, ``submit_s`` (the submit's round trip: the job checked, taken into the book
and journaled), ``tasks_per_s``, the master's CPU seconds over it (``master_cpu_s``), its
resident memory after (``master_rss_mb``) and what the job added to it per task
(``master_bytes_per_task``: the book's objects, and SQLite's page cache), ``ping_idle_ms``
(the median ping before the submit: the floor), ``ping_longest_ms`` and
``dispatch_longest_ms`` (the longest waits of the probes that overlapped the submit, counted
within it), and their
shares of the submit (``loop_held_share``, ``dispatch_held_share``: 1.0 would be a master that
answered nothing until the job was in).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
from rich.table import Table

from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.errors import TroupeError
from troupe.runtime.transports.loopback import free_endpoint

from .scale import reap, start_master

__all__ = ["longest_overlapping", "measure_submit", "submit_table"]

PROBE_GAP_S = 0.02
IDLE_PINGS = 20
_NO_JOB = "bench-submit-no-such-job"


async def _wait_master(runtime: Runtime, endpoint: str, timeout: float) -> None:
    with anyio.fail_after(timeout):
        while True:  # a bounded poll: the master process starts, then binds
            try:
                await runtime.control(endpoint, "ping", None, timeout=2.0)
                return
            except TroupeError:
                await anyio.sleep(0.2)


async def _probe(
    runtime: Runtime, endpoint: str, msg: str, payload: Any, stop: anyio.Event, out: list[tuple[float, float]]
) -> None:
    """Call the master back to back until ``stop``; ``out`` gets (sent, returned) monotonic times."""
    while not stop.is_set():
        sent = time.monotonic()
        try:
            await runtime.control(endpoint, msg, payload, timeout=600.0)
        except TroupeError:
            pass  # the cancel's answer is a refusal: what is measured is when it came
        out.append((sent, time.monotonic()))
        await anyio.sleep(PROBE_GAP_S)


def longest_overlapping(calls: list[tuple[float, float]], start: float, end: float) -> float:
    """The longest wait, in seconds, of the calls that overlapped [start, end], counted within it:
    a call sent just before the submit and answered after it held more than the submit took
    (a share of 1.0122)."""
    return max((min(b, end) - max(a, start) for a, b in calls if b >= start and a <= end), default=0.0)


async def _measure(endpoint: str, master_pid: int, tasks: int) -> dict[str, Any]:
    async with (
        process_runtime("bench", "bench-submit-ping", drain_timeout=0.1) as pinger,
        process_runtime("bench", "bench-submit-cancel", drain_timeout=0.1) as canceller,
        process_runtime("bench", "bench-submit", drain_timeout=0.1) as submitter,
    ):
        await _wait_master(submitter, endpoint, 60.0)
        idle = []
        for _ in range(IDLE_PINGS):
            sent = time.monotonic()
            await pinger.control(endpoint, "ping", None, timeout=10.0)
            idle.append(time.monotonic() - sent)
        proc = psutil.Process(master_pid)
        cpu0 = sum(proc.cpu_times()[:2])
        rss0 = proc.memory_info().rss
        pings: list[tuple[float, float]] = []
        cancels: list[tuple[float, float]] = []
        stop = anyio.Event()
        job = {"job": {"name": "big", "kind": "sleep", "count": tasks}}
        async with anyio.create_task_group() as tg:
            tg.start_soon(_probe, pinger, endpoint, "ping", None, stop, pings)
            tg.start_soon(_probe, canceller, endpoint, "cancel", {"job_id": _NO_JOB}, stop, cancels)
            start = time.monotonic()
            submit = {"job": job, "source": "bench"}
            reply = await submitter.control(endpoint, "submit", submit, timeout=600.0)
            end = time.monotonic()
            stop.set()
        cpu = sum(proc.cpu_times()[:2]) - cpu0
        rss = proc.memory_info().rss
    if reply.get("tasks") != tasks:
        raise RuntimeError(f"the master took {reply!r}, not a job of {tasks} tasks")
    submit_s = end - start
    ping_longest = longest_overlapping(pings, start, end)
    dispatch_longest = longest_overlapping(cancels, start, end)
    return {
        "tasks": tasks,
        "submit_s": submit_s,
        "tasks_per_s": tasks / submit_s,
        "master_cpu_s": cpu,
        "master_rss_mb": rss / 2**20,
        "master_bytes_per_task": (rss - rss0) / tasks,
        "ping_idle_ms": statistics.median(idle) * 1000.0,
        "ping_longest_ms": ping_longest * 1000.0,
        "dispatch_longest_ms": dispatch_longest * 1000.0,
        "loop_held_share": ping_longest / submit_s,
        "dispatch_held_share": dispatch_longest / submit_s,
        "probes": len(pings) + len(cancels),
    }


def measure_submit(tasks: int, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark and return its figures (see the module docstring)."""
    say = progress or (lambda _msg: None)
    endpoint = free_endpoint()
    with tempfile.TemporaryDirectory(prefix="troupe-submit-") as tmp:
        say("starting a master")
        master = start_master(Path(tmp), endpoint)
        try:
            say(f"submitting one job of {tasks:,} tasks")
            return anyio.run(
                _measure,
                endpoint,
                master.pid,
                tasks,
                backend="asyncio",
                backend_options={"use_uvloop": True},
            )
        finally:
            reap([master])


def submit_table(fig: dict[str, Any]) -> Table:
    """The figures as a table."""
    table = Table(title=f"one submit of {fig['tasks']:,} tasks to a real master")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("submit (checked, in the book, journaled)", f"{fig['submit_s']:.2f} s")
    table.add_row("tasks per second", f"{fig['tasks_per_s']:,.0f}")
    table.add_row("master CPU", f"{fig['master_cpu_s']:.2f} s")
    table.add_row(
        "master memory after (added per task)",
        f"{fig['master_rss_mb']:,.0f} MiB ({fig['master_bytes_per_task']:,.0f} B)",
    )
    table.add_row("ping, master idle (median)", f"{fig['ping_idle_ms']:.2f} ms")
    table.add_row(
        "longest ping during the submit (loop held)",
        f"{fig['ping_longest_ms']:.0f} ms ({fig['loop_held_share']:.0%} of the submit)",
    )
    table.add_row(
        "longest dispatcher call during it (a lease request waits)",
        f"{fig['dispatch_longest_ms']:.0f} ms ({fig['dispatch_held_share']:.0%} of the submit)",
    )
    return table
