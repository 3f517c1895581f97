"""The data generation pipeline a training run runs beside itself (a ``[datagen]`` table): it
writes ``train.dataset`` while the ranks wait for ``train.min_episodes`` committed episodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from .train_result import TrainingFailed

__all__ = ["run_datagen", "wait_episodes"]


async def run_datagen(cfg: Any, node: str, fresh: bool, say: Callable[[str], None]) -> dict[str, Any]:
    """Run ``cfg.datagen``'s pipeline on ``node`` into ``train.dataset``; its figures."""
    from troupe.runtime.pipeline.runner import run_pipeline

    dg = cfg.datagen
    starts: list[Any] = []
    result = await run_pipeline(
        dg.pipeline,
        cfg.train.dataset,
        items=dg.items,
        node=node,
        fresh=fresh,
        keep_outputs=False,
        on_start=starts.append,
        on_event=say,  # its folder's own lines too: made by other troupe code, rebuilt, adopted
    )
    counts = result.counts()
    if result.already_complete:  # nothing ran: the counts would all read 0
        say(f"data generation: already complete in {cfg.train.dataset} (an earlier run)")
    else:
        # As troupe run's closing line: what earlier runs did adds up to the items with the rest.
        before = result.earlier_runs(starts[0].before if starts else 0)
        say(
            f"data generation done: {counts['ok']} ok, {counts['pruned']} pruned, "
            f"{counts['dead']} dead{before}"
        )
    return {
        "items": result.counts(),
        "elapsed_s": result.metrics.elapsed_s,
        "finals": result.finals,
    }


async def wait_episodes(
    cfg: Any, datagen_done: anyio.Event, say: Callable[[str], None], poll_s: float
) -> None:
    """Return once ``train.min_episodes`` episodes are committed in ``train.dataset``.

    Raises TrainingFailed when the data generation ended with fewer.
    """
    from .dataset import committed_episodes

    wanted = int(cfg.train.min_episodes)
    say(f"waiting for {wanted} committed episode(s) in {cfg.train.dataset}")
    while True:
        have = await anyio.to_thread.run_sync(committed_episodes, cfg.train.dataset)
        if have >= wanted:
            say(f"{have} episode(s) committed; starting the ranks")
            return
        if datagen_done.is_set():
            raise TrainingFailed(
                f"data generation ended with {have} committed episode(s), fewer than "
                f"train.min_episodes = {wanted}"
            )
        await anyio.sleep(poll_s)
