"""What ``troupe run TRAIN.toml`` reports at the end of a training run: the table of its
figures, or one JSON object (``--json``), from its
:class:`~troupe.actors.training.train_result.TrainRunResult`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from troupe.cli.literal import literal

__all__ = ["bar_fields", "cache_line", "final_line", "result_json", "result_table", "steps_done"]


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
        "steps_this_run": data["steps_this_run"],
    }


def result_table(result: Any) -> Table:
    """The steps, the loss at the first and last step of this (re)start, samples/s, stage seconds
    per rank, requests per encoder, the latent cache, checkpoints."""
    table = Table(title="training", box=box.SIMPLE_HEAD, pad_edge=False, show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value")
    table.add_row("steps", steps_done(result))
    losses = result.losses
    if losses:  # rank 0's losses since the last (re)start: steps first_step + 1 on
        first = result.first_step + 1
        table.add_row(
            f"loss at step {first} / {first + len(losses) - 1}", f"{losses[0]:.4f} / {losses[-1]:.4f}"
        )
    else:
        table.add_row("loss first / last", "- / -")
    table.add_row("samples/s", f"{result.samples_per_s:.2f}")
    for rank, t in result.timings.items():
        table.add_row(
            literal(f"rank {rank} read / wait / train s"),
            f"{t['read_s']:.2f} / {t['wait_s']:.2f} / {t['train_s']:.2f}",
        )
    for actor, n in result.requests.items():
        # The ranks' asks to it (since their last (re)start), not the actor's own count.
        table.add_row(literal(f"requests to {actor}"), str(n) if n >= 0 else "no answer")
    if result.latent_cache is not None:
        table.add_row("latent cache", literal(cache_line(result.latent_cache)))
    table.add_row("restarts", str(result.restarts))
    table.add_row("checkpoints", literal(", ".join(Path(c).name for c in result.checkpoints) or "-"))
    table.add_row("placement", literal(", ".join(f"{a} on {n}" for a, n in result.placement.items())))
    table.add_row("wall s", f"{result.wall_s:.1f}")
    return table


def cache_line(cache: dict[str, Any]) -> str:
    """The latent cache's figures in a line; a corrupt entry is a miss too (deleted, encoded
    again), said with the misses; the disk tier's writes, with those skipped (its disk under the
    cache's reserve, or behind) and failed, which a rerun encodes again; figures without an
    encoder that did not answer, said partial."""
    line = (
        f"{cache['memory_hits']} memory hits, {cache['disk_hits']} disk hits, {cache['misses']} misses "
        f"({cache['corrupt']} of them corrupt: deleted, encoded again), "
        f"{cache['groups_encoded']} groups encoded, {cache['disk_writes']} written to disk "
        f"({cache['disk_writes_skipped']} skipped, {cache['disk_errors']} failed)"
    )
    unanswered, not_counted = cache.get("unanswered") or [], int(cache.get("not_counted") or 0)
    if unanswered:
        line += f"; partial: {', '.join(unanswered)} did not answer"
    elif not_counted:
        line += f"; partial: {not_counted} groups answered are not counted (an encoder's worker restarted)"
    elif cache.get("partial"):
        line += "; partial: an encoder did not answer"
    return line


def steps_done(result: Any) -> str:
    """The step reached, and of a resumed run the steps this run trained (a resumed run said
    "steps 200" of the 130 it trained)."""
    if result.resumed_from is None:
        return str(result.steps)
    return (
        f"{result.resumed_from + 1}-{result.steps} ({result.steps_this_run} this run, "
        f"resumed from {result.resumed_from})"
    )


def final_line(result: Any, checkpoint_dir: str) -> str:
    """The line under the table: the steps this run trained (and, resumed, which), the last loss,
    samples/s, the checkpoints and where: the folder they are in (``train.checkpoint_dir``,
    given as ``checkpoint_dir`` for a run that committed none), not ``--out``, which holds none
    when the config puts them elsewhere. Plain text: the caller escapes it for rich."""
    loss = "-" if result.loss is None else f"{result.loss:.4f}"
    trained = f"{result.steps_this_run} steps"
    if result.resumed_from is not None:
        trained += f" ({result.resumed_from + 1}-{result.steps}, resumed from step {result.resumed_from})"
    where = str(Path(result.checkpoints[-1]).parent) if result.checkpoints else checkpoint_dir
    return (
        f"trained {trained}: loss {loss}, {result.samples_per_s:.2f} samples/s, "
        f"{len(result.checkpoints)} checkpoint(s) in {where}"
    )


def bar_fields(step: int, target: int, start: int) -> dict[str, Any]:
    """The progress bar's position at rank 0's ``step``: it fills from ``start`` (the step the run
    resumed from) to ``target``, and ``at`` says the step reached of the target (a rank not yet
    resumed answers step 0: the bar showed "0/220" of a run resumed from 200)."""
    start = min(max(start, 0), target)
    at, total = max(step, start), max(target - start, 1)
    return {"completed": total if at >= target else at - start, "total": total, "at": f"{at}/{target}"}
