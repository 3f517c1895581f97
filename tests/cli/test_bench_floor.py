"""The asyncio floor of ``troupe bench messaging``: a bare uvloop + pyzmq ask, measured in the
same run as troupe, and troupe's ratio to it (issue 14, "the messaging floor, shown").

These check the floor's processes, not the machine's speed: no rate is bounded. The command's
floor figures are checked in the same run as its other figures (tests/e2e/test_cli.py)."""

from __future__ import annotations

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
