"""``troupe bench recovery --json`` reports how fast a torch-importing worker serves again after a
SIGKILL, forked from the node's template and spawned afresh, beside the bare spawn floor."""

from __future__ import annotations

import json
import subprocess
import sys

KEYS = (
    "spawn_floor_s",
    "torch_spawn_floor_s",
    "restart_serving_s",
    "torch_restart_serving_s",
    "torch_restart_serving_spawn_s",
    "torch_restart_over_floor",
)


def test_bench_recovery_json_has_the_torch_restart_figures() -> None:
    """One round: this checks the command and its figures, not the machine's speed."""
    proc = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "bench", "recovery", "--json", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{") :])  # after the progress lines
    for key in KEYS:
        assert report[key] > 0, key
    assert report["torch_restart_over_floor"] == report["torch_restart_serving_s"] / report["spawn_floor_s"]
