"""``troupe bench scale``: tiny runs, to check the command and its figures (prefetch, the
journal's batches), not speed."""

from __future__ import annotations

import math

import pytest

from support.bench_cli import bench_json
from troupe.cli.bench.scale import STRAGGLER_P, task_duration
from troupe.runtime.tasks.getter_config import GetterConfig

pytestmark = pytest.mark.e2e


def _bench_scale(*args: str) -> dict[str, float]:
    return bench_json("scale", *args)


def test_bench_scale_reports_prefetch_and_the_workers_own_counts() -> None:
    fig = _bench_scale("--workers", "6", "--tasks", "5", "--median-ms", "20", "--prefetch", "1")
    assert fig["prefetch"] == 1 and fig["tasks"] == 30
    for label in ("", "_no_speculation"):
        assert fig["makespan_s" + label] > 0 and fig["efficiency" + label] > 0
        assert fig["dispatch_per_s" + label] > 0
    # both jobs' tasks were started by the workers (backups and given-back leases add to it)
    assert fig["worker_started"] >= 60 and fig["worker_given_back"] >= 0


def test_task_durations_are_fixed_by_the_seed_and_heavy_tailed() -> None:
    first = [task_duration(seed, False, 0, 0.1) for seed in range(20_000)]
    assert first == [task_duration(seed, False, 7, 0.1) for seed in range(20_000)]  # lease unused
    ordered = sorted(first)
    assert ordered[len(ordered) // 2] == pytest.approx(0.1, rel=0.05)  # the median, with stragglers
    stragglers = sum(d > 0.1 * 4 for d in first) / len(first)  # 10x: far beyond sigma 0.5's spread
    assert stragglers == pytest.approx(STRAGGLER_P, abs=0.01)
    backups = [task_duration(seed, True, 3, 0.1) for seed in range(1000)]
    assert backups != first[:1000]  # a backup draws its own straggler chance


def test_bench_scale_reports_events_per_batch_and_append_time() -> None:
    """The master's group commit: every task was journaled (leased, then done) in batches."""
    fig = _bench_scale("--workers", "5", "--tasks", "4", "--median-ms", "20")
    assert fig["prefetch"] == GetterConfig("w", "n").prefetch == 1  # a real worker's default
    for label in ("", "_no_speculation"):
        assert fig["events_per_batch" + label] >= 1.0
        assert fig["append_ms_per_batch" + label] > 0.0
        # 20 tasks can take the master less than the CPU clock's tick: measured, not rounded away.
        assert math.isfinite(fig["master_cpu_s_per_1k" + label]) and fig["master_cpu_s_per_1k" + label] >= 0.0
        # The collector's pauses, from the master's status: none may have run in a job this small.
        assert fig["master_gc_s_per_1k" + label] >= 0.0
        assert fig["master_gc_longest_ms" + label] >= 0.0
