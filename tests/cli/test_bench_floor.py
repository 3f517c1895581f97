"""The asyncio floor of ``troupe bench messaging``: a bare uvloop + pyzmq ask, measured in the
same run as troupe, and troupe's ratio to it (issue 14, "the messaging floor, shown").

These check the figures and the processes, not the machine's speed: no rate is bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from troupe.cli.bench.floor import floor_echo_round_trips
from troupe.cli.bench.messaging import bench_keys
from troupe.cli.bench.raw import run_apart


@pytest.mark.parametrize("window", [1, 64])
def test_floor_echo_answers_every_ask(window: int) -> None:
    """The floor runs in processes of its own (reaped by ``run_apart``) and gives a rate."""
    assert run_apart(partial(floor_echo_round_trips, 640, window, "small"), timeout_s=120) > 0


def test_floor_echo_with_curve(tmp_path: Path) -> None:
    """With ``--curve`` the floor's sockets authenticate and encrypt too, as troupe's do."""
    _, pairs = bench_keys(tmp_path)
    assert run_apart(partial(floor_echo_round_trips, 256, 64, "small", pairs), timeout_s=120) > 0


def test_floor_refuses_large_payloads() -> None:
    with pytest.raises(ValueError, match="'large'"):
        floor_echo_round_trips(64, 1, "large")


def test_bench_messaging_quick_json_reports_the_floor() -> None:
    """`bench messaging --quick --json` reports the floor's rates and troupe's ratio to them,
    beside the ratio to blocking pyzmq."""
    # A session of its own: on a timeout the whole group goes, raw peers and workers included.
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "bench", "messaging", "--quick", "--repeat", "1", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, stderr
    fig = json.loads(stdout)
    for key in ("ask1", "ask64"):
        floor, troupe = fig[f"floor_{key}_per_s"], fig[f"troupe_{key}_per_s"]
        assert floor > 0 and troupe > 0
        assert fig[f"{key}_floor_ratio"] == pytest.approx(troupe / floor)
        assert fig[f"{key}_ratio"] == pytest.approx(troupe / fig[f"raw_{key}_per_s"])
