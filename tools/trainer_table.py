"""The training ranks of a node's status reply as a table (``troupe ctl status``).

A rank is a trainer actor; its figures are those its ``metrics()`` gives (``actor_metrics`` in
the worker's status, what ``--json`` and Prometheus show): the table had named the run's
``--out`` and the messages each rank handled, and nothing of how far it trained.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from .literal import literal

__all__ = ["TRAINER_KIND", "trainer_table"]

# TrainerActor's kind (its class name), written out: importing the actor would import torch
# into every `ctl status`.
TRAINER_KIND = "TrainerActor"


def trainer_table(workers: list[dict[str, Any]]) -> Table | None:
    """One row per trainer actor of ``workers`` (a node's ``workers``) that answered: its step of
    the run's steps, last loss, samples/s, newest committed checkpoint and whether it trains;
    None where the node hosts no rank."""
    table = Table(title="training ranks")
    for col in ("rank", "worker", "step", "loss", "samples/s", "checkpoint", "running"):
        table.add_column(
            col, no_wrap=col == "rank", justify="left" if col in ("rank", "worker", "running") else "right"
        )
    for w in workers:
        runtime = w.get("runtime") or {}
        figures = runtime.get("actor_metrics") or {}
        for name, a in (runtime.get("actors") or {}).items():
            if a.get("kind") == TRAINER_KIND:
                table.add_row(literal(name), literal(w["name"]), *_rank_cells(figures.get(name) or {}))
    return table if table.row_count else None


def _rank_cells(f: dict[str, Any]) -> list[Text]:
    """A rank's figures as cells; one not known yet (the loss before the first step, the
    checkpoint before the first commit, all of them where ``metrics()`` failed) is ``-``."""
    if not f:
        return [literal("-")] * 5
    step = f"{_whole(f.get('step'))}/{_whole(f.get('steps'))}"
    running = "-" if f.get("running") is None else ("yes" if f["running"] else "no")
    return [
        literal(step),
        literal("-" if f.get("loss") is None else f"{f['loss']:.4f}"),
        literal("-" if f.get("samples_per_s") is None else f"{f['samples_per_s']:.1f}"),
        literal(_whole(f.get("checkpoint_step"))),
        literal(running),
    ]


def _whole(value: Any) -> str:
    """A step (a float in the reply, as every figure is) as its whole number, or ``-``."""
    return "-" if value is None else str(int(value))
