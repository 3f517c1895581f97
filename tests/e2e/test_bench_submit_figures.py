"""``troupe bench submit``: a small run, to check the command and its figures, not speed."""

from __future__ import annotations

import pytest

from support.bench_cli import bench_json

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
