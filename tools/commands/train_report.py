"""What ``troupe run TRAIN.toml`` reports at the end of a training run: the table of its
figures, or one JSON object (``--json``), from its
:class:`~troupe.actors.training.train_result.TrainRunResult`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

__all__ = ["cache_line", "result_json", "result_table"]


def result_json(result: Any) -> dict[str, Any]:
    """The run's figures as one JSON object (``troupe run TRAIN.toml --json``)."""
    data: dict[str, Any] = result.as_json()
    return {
        "steps": data["steps"],
        "loss": data["loss"],
        "losses": data["losses"],
        "samples_per_s": data["samples_per_s"],
        "timings": data["timings"],
        "requests": data["requests"],
        "restarts": data["restarts"],
        "checkpoints": data["checkpoints"],
        "placement": data["placement"],
        "wall_s": data["wall_s"],
        "first_step": data["first_step"],
        "resumed_from": data["resumed_from"],
        "datagen": data["datagen"],
        "latent_cache": data["latent_cache"],
    }


def result_table(result: Any) -> Table:
    """Loss first and last, samples/s, stage seconds per rank, requests per encoder, checkpoints."""
    table = Table(title="training", box=box.SIMPLE_HEAD, pad_edge=False, show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value")
    losses = result.losses
    first = f"{losses[0]:.4f}" if losses else "-"
    last = f"{losses[-1]:.4f}" if losses else "-"
    table.add_row("steps", str(result.steps))
    table.add_row("loss first / last", f"{first} / {last}")
    table.add_row("samples/s", f"{result.samples_per_s:.2f}")
    for rank, t in result.timings.items():
        table.add_row(
            f"rank {escape(rank)} read / wait / train s",
            f"{t['read_s']:.2f} / {t['wait_s']:.2f} / {t['train_s']:.2f}",
        )
    for actor, n in result.requests.items():
        table.add_row(f"requests {escape(actor)}", str(n) if n >= 0 else "no answer")
    if result.latent_cache is not None:
        table.add_row("latent cache", escape(cache_line(result.latent_cache)))
    table.add_row("restarts", str(result.restarts))
    table.add_row("checkpoints", escape(", ".join(Path(c).name for c in result.checkpoints) or "-"))
    table.add_row("placement", escape(", ".join(f"{a} on {n}" for a, n in result.placement.items())))
    table.add_row("wall s", f"{result.wall_s:.1f}")
    return table


def cache_line(cache: dict[str, Any]) -> str:
    """The latent cache's figures in a line; a corrupt entry is a miss too (deleted, encoded
    again), said with the misses; figures without an encoder that did not answer, said partial."""
    line = (
        f"{cache['memory_hits']} memory hits, {cache['disk_hits']} disk hits, {cache['misses']} misses "
        f"({cache['corrupt']} of them corrupt: deleted, encoded again), "
        f"{cache['groups_encoded']} groups encoded"
    )
    if cache.get("partial"):
        line += f"; partial: {', '.join(cache.get('unanswered') or ['an encoder'])} did not answer"
    return line
