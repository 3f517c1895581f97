"""``troupe bench scale`` reports the master's group commit: a tiny run, figures not speed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

TINY = ["--workers", "5", "--tasks", "4", "--median-ms", "20"]


def test_bench_scale_reports_events_per_batch_and_append_time() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "bench", "scale", "--json", *TINY],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # on a timeout the whole group goes: the master and the workers
    )
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, stderr
    fig = json.loads(stdout)
    for label in ("", "_no_speculation"):
        # every task was journaled (leased, then done) in batches of at least one event each
        assert fig["events_per_batch" + label] >= 1.0
        assert fig["append_ms_per_batch" + label] > 0.0
        assert fig["master_cpu_s_per_1k" + label] > 0.0
