"""The bounds of ``troupe bench``'s numeric options: a benchmark given a number past them is
refused in one line, exit 2, before it measures anything. Without an upper bound,
``bench scale --median-ms 1e300`` was taken and slept (tasks of 10^297 seconds: it ran until it
was killed), and ``--repeat 1000000000`` ran as long."""

from __future__ import annotations

__all__ = [
    "MOST_ACTORS",
    "MOST_CPU_ITEMS",
    "MOST_GROUP_SIZE",
    "MOST_INFLIGHT",
    "MOST_MEDIAN_MS",
    "MOST_REPEAT",
    "MOST_SCENES",
    "MOST_SECONDS",
    "MOST_STEPS",
    "MOST_SYNTHETIC",
    "MOST_TASKS",
    "MOST_WORKERS",
]

MOST_MEDIAN_MS = 60_000.0  # bench scale: a task's median duration, a minute
MOST_SECONDS = 60.0  # bench recovery: its node's heartbeat interval and timeout
MOST_REPEAT = 100  # rounds (medians) of any benchmark
MOST_SCENES = 10_000  # bench pipeline
MOST_SYNTHETIC = 1_000_000
MOST_CPU_ITEMS = 100_000
MOST_STEPS = 100_000  # bench train
MOST_INFLIGHT = 64
MOST_ACTORS = 64  # a worker process each
MOST_GROUP_SIZE = 1_024
# bench scale: each 250 simulated workers are a process of their own, and their tasks one job.
MOST_WORKERS = 10_000
MOST_TASKS = 10_000_000
