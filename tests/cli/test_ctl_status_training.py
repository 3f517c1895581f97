"""tr 1: ``troupe ctl status`` shows each training rank's figures (step, loss, samples/s, last
committed checkpoint), which ``--json`` and Prometheus had shown and its tables had not: they
named the run's ``--out`` and the messages each rank handled."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rich.console import Console

from troupe.actors.training.trainer import TrainerActor
from troupe.cli.tables import status_tables
from troupe.cli.trainer_table import TRAINER_KIND

NODE = {"node": "n1", "pid": 1, "endpoint": "tcp://127.0.0.1:45600", "uptime_s": 3.0, "rss_mib": 40.0}


def rendered(status: dict[str, Any]) -> str:
    console = Console(record=True, width=200, color_system=None)
    for table in status_tables(status):
        console.print(table)
    return console.export_text()


def ranks_rows(status: dict[str, Any]) -> list[list[str]]:
    """The body rows of the "training ranks" table, as their cells."""
    text = rendered(status)
    assert "training ranks" in text, text
    table = text[text.index("training ranks") :]
    lines = [line for line in table.splitlines() if line.startswith("│")]
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines]


def rank_worker(worker: str, rank: str, figures: dict[str, float] | None) -> dict[str, Any]:
    actors = {rank: {"kind": TRAINER_KIND, "handled": 9, "failed": 0, "mailbox_depth": 0,
                     "mailbox_capacity": 64, "busy": False}}  # fmt: skip
    runtime: dict[str, Any] = {"actors": actors, "actor_metrics": {} if figures is None else {rank: figures}}
    return {"name": worker, "kind": "default", "state": "running", "pid": 4242, "actors": [rank],
            "restarts": 0, "exit": "", "rss_mib": 30.0, "runtime": runtime}  # fmt: skip


def test_each_rank_shows_its_step_loss_rate_and_checkpoint() -> None:
    status = {**NODE, "out": "/data/train-out", "workers": [
        rank_worker("train-w-0", "train-rank-0", {"running": 1.0, "step": 12.0, "steps": 40.0,
                    "loss": 0.123456, "samples_per_s": 3.25, "checkpoint_step": 10.0}),
        rank_worker("train-w-1", "train-rank-1", {"running": 0.0, "step": 0.0, "steps": 40.0,
                    "samples_per_s": 0.0}),
    ]}  # fmt: skip
    assert ranks_rows(status) == [
        ["train-rank-0", "train-w-0", "12/40", "0.1235", "3.2", "10", "yes"],
        # Before its first step and first commit: no loss, no checkpoint, not a 0 of either.
        ["train-rank-1", "train-w-1", "0/40", "-", "0.0", "-", "no"],
    ]


def test_a_rank_without_figures_shows_dashes_and_a_node_without_ranks_no_table() -> None:
    status = {**NODE, "workers": [rank_worker("train-w-0", "train-rank-0", None)]}
    assert ranks_rows(status) == [["train-rank-0", "train-w-0", "-", "-", "-", "-", "-"]]
    other = rank_worker("w-echo", "echo", None)
    other["runtime"]["actors"]["echo"]["kind"] = "Echo"
    assert "training ranks" not in rendered({**NODE, "workers": [other]})


def test_a_rank_s_name_from_the_wire_is_text_not_markup() -> None:
    status = {**NODE, "workers": [rank_worker("w[/]", "rank[bold]0", {"step": 1.0, "steps": 2.0})]}
    assert ranks_rows(status)[0][:2] == ["rank[bold]0", "w[/]"]


def test_the_kind_written_out_is_the_trainer_actor_s() -> None:
    assert TrainerActor.kind == TRAINER_KIND


def test_every_figure_docs_metrics_lists_for_a_rank_is_in_its_line() -> None:
    """docs/METRICS.md's trainer figures, each given a value of its own, are each on the rank's
    line: a figure the trainer comes to give is shown, or this names it."""
    doc = (Path(__file__).parents[2] / "docs" / "METRICS.md").read_text(encoding="utf-8")
    section = doc[doc.index("The trainer actor (") :]
    section = section[: section.index("```")]
    names = re.findall(r"^\| `(\w+)` \| gauge \|", section, flags=re.MULTILINE)
    assert names == ["running", "step", "steps", "loss", "samples_per_s", "checkpoint_step"], names
    figures = {
        "running": 1.0,
        "step": 7.0,
        "steps": 41.0,
        "loss": 0.5,
        "samples_per_s": 2.5,
        "checkpoint_step": 6.0,
    }
    (row,) = ranks_rows({**NODE, "workers": [rank_worker("w", "r", figures)]})
    assert row[2:] == ["7/41", "0.5000", "2.5", "6", "yes"]
