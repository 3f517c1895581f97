"""``troupe bench submit``: a small run, to check the command and its figures, not speed."""

from __future__ import annotations

import pytest

from support.bench_cli import bench_json
from troupe.cli.bench.submit import longest_overlapping

pytestmark = pytest.mark.e2e


def test_bench_submit_reports_the_submit_and_what_the_probes_waited() -> None:
    fig = bench_json("submit", "--tasks", "5000")
    assert fig["tasks"] == 5000  # the master took the job whole (the bench checks its reply)
    assert fig["submit_s"] > 0 and fig["tasks_per_s"] == pytest.approx(5000 / fig["submit_s"])
    assert fig["ping_idle_ms"] > 0 and fig["probes"] >= 2  # both probes overlapped the submit
    assert fig["master_rss_mb"] > 0 and fig["master_cpu_s"] >= 0
    assert fig["master_bytes_per_task"] * 5000 < fig["master_rss_mb"] * 2**20  # part of it
    for probe in ("ping", "dispatch"):
        longest_s = fig[f"{probe}_longest_ms"] / 1000.0
        assert longest_s > 0
        assert fig[f"{'loop' if probe == 'ping' else 'dispatch'}_held_share"] == pytest.approx(
            longest_s / fig["submit_s"]
        )
        assert 0 < fig[f"{'loop' if probe == 'ping' else 'dispatch'}_held_share"] <= 1


def test_a_probe_that_spans_the_submit_counts_only_the_time_within_it() -> None:
    """Sent before the submit and answered after it, it held longer than the submit took:
    a share above 1 (1.0122)."""
    calls = [(9.0, 10.5), (10.2, 10.4), (12.5, 13.0)]  # before-and-into, inside, after
    assert longest_overlapping(calls, 10.0, 12.0) == pytest.approx(0.5)
    assert longest_overlapping([(9.0, 13.0)], 10.0, 12.0) == pytest.approx(2.0)  # the whole submit
    assert longest_overlapping([], 10.0, 12.0) == 0.0
