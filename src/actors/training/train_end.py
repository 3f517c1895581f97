"""The end of one training run: its result, from the ranks' last answers, the committed
checkpoints and the encoder actors' figures (asked before the cluster's exit stops them), and the
line said where the latent cache's disk tier stored fewer entries than it was given.

:class:`TrainEnd` is a part of :class:`~troupe.actors.training.train_driver.TrainDriver`: it
uses the driver's fields.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from troupe.actors.encoders.latent_cache import DISK_RESERVE
from troupe.runtime.library_logging import get_logger

from .encoder_figures import ask_encoders, not_stored_line, rank_asks
from .train_result import TrainRunResult, committed_checkpoints, rank_timings
from .train_workers import ASK_S, TrainWorkers

__all__ = ["TrainEnd"]

log = get_logger(__name__)


class TrainEnd(TrainWorkers):
    """Gathers the run's result (a part of the driver)."""

    restarts: int
    resumed_from: int | None
    first_step: int
    datagen: dict[str, Any] | None

    async def _result(self, final: list[dict[str, Any]]) -> TrainRunResult:
        head = final[0]
        result: dict[str, Any] = head["result"] if isinstance(head.get("result"), dict) else {}
        losses = self._losses(result)
        timings = {str(r.index): rank_timings(r.last) for r in self.ranks}
        # Asked here, before the cluster's exit stops the encoder actors (their counts go with them),
        # each where its node says it listens now: one the node restarted listens elsewhere, and
        # the ask to its old address waited out its deadline and dropped its counts.
        for actor, worker, host in self.encoders:
            await self.addresses.resolve_at_node(actor, worker, host)
        names = [a for a, _, _ in self.encoders]
        encoders = await ask_encoders(
            lambda actor: self.rt.ref(self.addresses.of(actor)).ask("stats", None, timeout=ASK_S),
            names,
            rank_asks(names, [r.last for r in self.ranks]),  # the run's requests: the ranks' asks
        )
        if self.encoders:
            self._say_not_stored(encoders.latent_cache)
        return TrainRunResult(
            steps=int(head.get("step") or 0),
            losses=losses,
            loss=losses[-1] if losses else None,
            samples_per_s=sum(float(r.last.get("samples_per_s") or 0.0) for r in self.ranks),
            timings=timings,
            requests=encoders.requests,
            restarts=self.restarts,
            checkpoints=committed_checkpoints(Path(self.cfg.train.checkpoint_dir)),
            placement=self.placement,
            wall_s=0.0,
            resumed_from=self.resumed_from,
            first_step=self.first_step,
            datagen=self.datagen,
            latent_cache=encoders.latent_cache if self.encoders else None,
        )

    def _say_not_stored(self, cache: dict[str, Any]) -> None:
        """Say once, and log at warning, where the latent cache's disk tier stored fewer entries
        than it was given (a disk under the cache's reserve, or failing): nothing said so, and
        every rerun encoded them all again. The free space is this host's disk's, where the
        encoders run (none on a cluster: its hosts' own disks)."""
        cache_dir = self.cfg.encoders.cache_dir
        free = None if self.master is not None else _free_bytes(Path(cache_dir))
        line = not_stored_line(cache, cache_dir, free, DISK_RESERVE)
        if line is None:
            return
        log.warning(
            "train_latent_cache_not_stored",
            disk_writes=cache["disk_writes"],
            disk_writes_skipped=cache["disk_writes_skipped"],
            disk_errors=cache["disk_errors"],
            cache_dir=cache_dir,
            free_bytes=free,
            reserve_bytes=DISK_RESERVE,
            note=line,
        )
        self.say(line)

    def _losses(self, result: dict[str, Any]) -> list[float]:
        """Rank 0's losses of the last (re)start: steps ``first_step + 1`` to the end."""
        return [float(x) for x in result.get("losses") or []]


def _free_bytes(folder: Path) -> int | None:
    """The free bytes of the disk holding ``folder``; None where it cannot be asked."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None
