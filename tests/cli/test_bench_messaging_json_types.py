"""``troupe bench messaging --json`` prints its counts as ints and ``curve`` as a bool (finding
ob 9): ``"curve": 0.0`` is true to jq, so ``jq 'select(.curve)'`` picked the runs without CURVE,
and a typed reader expecting an int got ``1.0``. The measurements are stand-ins here; the
command's own run is tests/e2e/test_cli.py and tests/e2e/test_curve_bench.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from troupe.cli.bench import messaging


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """The throughputs and the start-up measured in no time: only the figures' shapes matter."""

    async def figures(*_args: Any) -> dict[str, float]:
        rates = {}
        for key in ("tell_small", "tell_large", "ask1", "ask64"):
            rates |= {f"raw_{key}_per_s": 100.0, f"troupe_{key}_per_s": 50.0}
            rates[f"troupe_local_{key}_per_s"] = 80.0
        return rates | {"floor_ask1_per_s": 60.0, "floor_ask64_per_s": 70.0}

    async def startup(_log_dir: Path, _keys: Path | None = None) -> dict[str, float | int]:
        return {"startup_s": 0.5, "idle_rss_mib": 90.0, "idle_pss_mib": 60.0, "idle_processes": 4}

    monkeypatch.setattr(messaging, "_figures", figures)
    monkeypatch.setattr(messaging, "measure_startup", startup)
    monkeypatch.setattr(messaging, "bench_keys", lambda _tmp: (None, None))


@pytest.mark.parametrize("curve", [False, True])
def test_runs_are_an_int_and_curve_a_bool_in_the_json(measured: None, curve: bool) -> None:
    fig = json.loads(json.dumps(messaging.measure_messaging(quick=True, runs=3, curve=curve)))
    assert fig["curve"] is curve
    assert fig["runs"] == 3 and type(fig["runs"]) is int
    assert fig["ask1_ratio"] == pytest.approx(0.5)
    assert fig["ask64_floor_ratio"] == pytest.approx(50 / 70)
