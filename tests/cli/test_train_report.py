"""What ``troupe run TRAIN.toml`` prints at the end of a run, from its result: the latent cache's
figures (a line of the table, an object of --json)."""

from __future__ import annotations

import io
import json
from typing import Any

from rich.console import Console

from troupe.actors.training.train_result import TrainRunResult
from troupe.cli.commands.train_report import result_json, result_table

CACHE = {"memory_hits": 0, "disk_hits": 29, "misses": 3, "corrupt": 2, "groups_encoded": 3,
         "partial": False, "unanswered": []}  # fmt: skip


def _result(**changes: Any) -> TrainRunResult:
    figures: dict[str, Any] = {
        "steps": 8, "losses": [2.0 - i / 10 for i in range(8)], "loss": 1.3, "samples_per_s": 30.0,
        "timings": {"0": {"read_s": 0.5, "wait_s": 0.2, "train_s": 0.8}},
        "requests": {"train-encode-0": 8, "train-encode-1": 8}, "restarts": 0,
        "checkpoints": ["/o/checkpoints/step-000000008"], "placement": {"train-rank-0": "local"},
        "wall_s": 9.0, "latent_cache": dict(CACHE),
    }  # fmt: skip
    return TrainRunResult(**(figures | changes))


def _rows(result: TrainRunResult) -> dict[str, str]:
    out = io.StringIO()
    Console(file=out, width=300).print(result_table(result))
    rows = {}
    for line in out.getvalue().splitlines():
        what, _, value = line.strip().partition("  ")
        if value:
            rows[what] = " ".join(value.split())
    return rows


def test_the_latent_cache_is_a_line_of_the_table() -> None:
    assert _rows(_result())["latent cache"] == (
        "0 memory hits, 29 disk hits, 3 misses (2 of them corrupt: deleted, encoded again), 3 groups encoded"
    )


def test_figures_of_encoders_not_asked_are_said_partial() -> None:
    partial = CACHE | {"partial": True, "unanswered": ["train-encode-1"]}
    line = _rows(_result(latent_cache=partial))["latent cache"]
    assert line.endswith("; partial: train-encode-1 did not answer"), line


def test_no_encoder_actors_no_cache_line() -> None:
    assert "latent cache" not in _rows(_result(latent_cache=None, requests={}))


def test_json_has_the_latent_cache_object() -> None:
    data = json.loads(json.dumps(result_json(_result())))
    assert data["latent_cache"] == CACHE
    assert json.loads(json.dumps(result_json(_result(latent_cache=None))))["latent_cache"] is None
