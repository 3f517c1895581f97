"""What ``troupe run TRAIN.toml`` prints at the end of a run, from its result: the latent cache's
figures (a line of the table, an object of --json); of a resumed run, what this run did and where
it stands (it said "steps 200" and "trained 200 steps" of a run that trained 130 of them); and its
progress bar, from the step it resumed from to the target."""

from __future__ import annotations

import io
import json
from typing import Any

from rich.console import Console

from troupe.actors.training.train_result import TrainRunResult
from troupe.cli.commands.train_report import bar_fields, final_line, result_json, result_table

CACHE = {"memory_hits": 0, "disk_hits": 29, "misses": 3, "corrupt": 2, "disk_writes": 1,
         "disk_writes_skipped": 2, "disk_errors": 0, "groups_encoded": 3, "partial": False,
         "unanswered": [], "not_counted": 0}  # fmt: skip


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
        "0 memory hits, 29 disk hits, 3 misses (2 of them corrupt: deleted, encoded again), 3 groups "
        "encoded, 1 written to disk (2 skipped, 0 failed)"
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


def _resumed() -> TrainRunResult:
    """Trained to 70 by an earlier run, resumed to 200: losses of steps 71 to 200."""
    losses = [1.4321] + [1.0] * 128 + [0.9876]
    return _result(steps=200, losses=losses, loss=losses[-1], resumed_from=70, first_step=70)


def test_a_resumed_run_says_what_it_did_and_where_it_stands() -> None:
    rows = _rows(_resumed())
    assert rows["steps"] == "71-200 (130 this run, resumed from 70)"
    assert rows["loss at step 71 / 200"] == "1.4321 / 0.9876"
    line = final_line(_resumed(), "train-out")
    assert line.startswith("trained 130 steps (71-200, resumed from step 70): loss 0.9876, "), line


def test_a_run_from_the_start_says_its_steps() -> None:
    rows = _rows(_result())
    assert rows["steps"] == "8" and rows["loss at step 1 / 8"] == "2.0000 / 1.3000"
    assert final_line(_result(), "o").startswith("trained 8 steps: loss 1.3000, 30.00 samples/s")
    restarted = _result(first_step=5, losses=[1.5, 1.4, 1.3])  # its losses go on from the restart
    assert _rows(restarted)["loss at step 6 / 8"] == "1.5000 / 1.3000"


def test_the_final_line_names_the_checkpoints_folder_not_out() -> None:
    """A train.checkpoint_dir outside --out: the line named --out, which holds no checkpoint."""
    kept = ["/data/ckx/step-000000004", "/data/ckx/step-000000008"]
    line = final_line(_result(checkpoints=kept), "/data/ckx")
    assert line.endswith("2 checkpoint(s) in /data/ckx"), line
    assert final_line(_result(checkpoints=kept), "/data/out").endswith("in /data/ckx")
    assert final_line(_result(checkpoints=[]), "/data/ckx").endswith("0 checkpoint(s) in /data/ckx")


def test_json_keeps_steps_the_step_reached_and_adds_this_runs_count() -> None:
    data = json.loads(json.dumps(result_json(_resumed())))
    assert data["steps"] == 200 and data["first_step"] == 70 and data["resumed_from"] == 70
    assert data["steps_this_run"] == 130 == len(data["losses"])
    assert result_json(_result())["steps_this_run"] == 8


def test_the_bar_fills_from_the_resumed_step_to_the_target() -> None:
    assert bar_fields(0, 220, 200) == {"completed": 0, "total": 20, "at": "200/220"}  # not "0/220"
    assert bar_fields(205, 220, 200) == {"completed": 5, "total": 20, "at": "205/220"}
    assert bar_fields(220, 220, 200) == {"completed": 20, "total": 20, "at": "220/220"}
    assert bar_fields(3, 10, 0) == {"completed": 3, "total": 10, "at": "3/10"}
