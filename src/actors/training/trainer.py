"""The trainer actor: one rank's whole training run (world model, DDP, checkpoints, resume).

One ``TrainerActor`` per worker process. The run driver asks:

- ``start {config, out, rank, world_size, encoders, rendezvous[, host]}``: ``config`` is a
  :class:`~troupe.actors.training.train_config.TrainConfig` as JSON data (``to_data()``),
  validated here (a bad one is refused with its one-line error); ``encoders`` the encoder actors'
  names (every rank the same list); ``rendezvous`` the actor name through which the ranks find
  rank 0 (:func:`~troupe.actors.training.ranks.rendezvous_from`; ``host`` is the address the
  other ranks reach rank 0 at, 127.0.0.1 by default). Answers at once
  ``{"started": true, "resumed_from": step or None}``; the run goes on in a background task.
- ``progress``: state (idle, starting, running, done, failed), step, loss, rate, stage timings,
  the last committed checkpoint, the error; when done, ``result`` (losses, final checkpoint, the
  weights' sha256).
- ``stop``: cancels the run after the step in progress; a checkpoint being written completes
  (its snapshot was taken before) or is left uncommitted, never committed half-written.

Determinism: the world model is built after ``torch.manual_seed(seed + rank)`` (DDP then
broadcasts rank 0's weights); the sampler's order depends on the seed and its global position
alone; each sample's flow noise and time come from a generator seeded by (seed, step, clip
index), so they do not depend on the rank, the batch or the run that draws them. No dropout. A
checkpoint holds model, optimizer, LR schedule, RNG states and the sampler's position, so a
resumed run computes the same steps as an uninterrupted one, with encoding local or remote.
The model trains on a GPU only when ``[trainers] gpus`` is above 0 and CUDA is present (local
encoding stays on the CPU); bit-identical results are promised on CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from troupe.runtime import Actor, ConfigError, handles
from troupe.runtime.library_logging import get_logger

from .checkpoint import CheckpointSaveFailed, CheckpointUnreadable, checkpoint_path
from .dataset import DatasetDamaged, DatasetNotFound, NotEnoughEpisodes, being_written
from .inflight import (
    GroupFailed,
    InflightConfig,
    StageTimings,
    TrainResult,
    actor_encoder,
    train_local,
    train_remote,
)
from .rank_run import RankRun, StartRequest, committed_step
from .rank_session import (
    LossNotFinite,
    RankSession,
    ResumeMismatch,
    Stopped,
    lr_lambda,
    sample_seed,
    weights_sha256,
)
from .ranks import RanksUnreachable, close_ranks, init_ranks, rendezvous_from
from .sampler import TooFewClips

__all__ = ["RankRun", "StartRequest", "TrainerActor", "lr_lambda", "sample_seed", "weights_sha256"]

log = get_logger(__name__)

STOP_WAIT_S = 4.0
"""Seconds a stopping worker waits for its run to end and checkpoint: under a node's default
stop grace (5 s), after which the node kills the worker."""


class TrainerActor(Actor):
    """One trainer rank (see the module). ``threads``: torch threads when the config sets none."""

    mailbox_capacity = 64

    def __init__(self, threads: int | None = None) -> None:
        if threads is not None and threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self.run: RankRun | None = None

    @handles("start")
    async def start(self, payload: Any) -> dict[str, Any]:
        if self.run is not None and self.run.state in ("starting", "running"):
            raise RuntimeError(f"rank {self.run.request.rank} is already {self.run.state}; stop it first")
        request = StartRequest.parse(payload)
        run = RankRun(request)
        run.resumed_from = committed_step(request.config.train.checkpoint_dir)
        self.run = run
        self.runtime.start_soon(self._run, run)
        return {"started": True, "resumed_from": run.resumed_from}

    @handles("progress")
    def report(self, _: Any) -> dict[str, Any]:
        run = self.run
        if run is None:
            return {"state": "idle", "step": 0, "steps": 0, "loss": None, "loss_avg": None,
                    "samples_per_s": 0.0, "timings": StageTimings().as_dict(), "requests": [],
                    "retries": 0, "checkpoint": None, "error": None}  # fmt: skip
        result = run.result
        timings = result.timings if result is not None else run.timings
        reply: dict[str, Any] = {
            "state": run.state,
            "rank": run.request.rank,
            "step": run.step,
            "steps": run.request.config.train.steps,
            "resumed_from": run.resumed_from,
            "loss": run.losses[-1] if run.losses else None,
            "loss_avg": sum(run.recent) / len(run.recent) if run.recent else None,
            "samples_per_s": timings.samples_per_s,
            "timings": timings.as_dict(),
            "requests": list(result.requests) if result is not None else [],
            "retries": result.retries if result is not None else 0,
            "checkpoint": committed_step(run.request.config.train.checkpoint_dir),
            "error": run.error,
            "final": run.error_final,
            "note": run.note,
        }
        if run.state == "done" and run.final is not None:
            reply["result"] = run.final
        return reply

    def metrics(self) -> dict[str, float]:
        """The node exports these (docs/METRICS.md), and ``ctl status --json`` shows them: the
        rank's run seen from outside, as ``progress`` answers it (a figure not known yet, the
        loss before the first step or the checkpoint before the first commit, is left out)."""
        run = self.run
        if run is None:
            return {"running": 0, "step": 0, "steps": 0, "samples_per_s": 0.0}
        timings = run.result.timings if run.result is not None else run.timings
        figures: dict[str, float] = {
            "running": 1 if run.state in ("starting", "running") else 0,
            "step": run.step,
            "steps": run.request.config.train.steps,
            "samples_per_s": timings.samples_per_s,
        }
        if run.losses:
            figures["loss"] = run.losses[-1]
        checkpoint = committed_step(run.request.config.train.checkpoint_dir)
        if checkpoint is not None:
            figures["checkpoint_step"] = checkpoint
        return figures

    async def stopping(self) -> None:
        """The worker stops (the run's Ctrl-C, a node's stop): end the run after its step in
        progress and let it checkpoint that step, within the node's stop grace."""
        run = self.run
        if run is None or run.state not in ("starting", "running"):
            return
        run.stop.set()
        if run.scope is not None:
            run.scope.cancel()
        with anyio.move_on_after(STOP_WAIT_S):
            await run.ended.wait()

    @handles("stop")
    def stop(self, _: Any) -> dict[str, Any]:
        run = self.run
        if run is None or run.state not in ("starting", "running"):
            return {"stopped": False, "state": run.state if run is not None else "idle"}
        run.stop.set()
        if run.scope is not None:
            run.scope.cancel()
        return {"stopped": True, "state": run.state}

    async def _run(self, run: RankRun) -> None:
        session: RankSession | None = None
        joined = False
        failed = False
        try:
            with anyio.CancelScope() as scope:
                run.scope = scope
                if run.request.config.trainers.threads is None and self.threads is not None:
                    run.request = _with_threads(run.request, self.threads)
                if run.request.world_size > 1:
                    await self._join(run.request)
                    joined = True
                session = await self._session(run)
                run.state = "running"
                run.result = await self._train(run, session)
                run.final = {
                    "losses": list(run.losses),
                    "final_checkpoint": str(checkpoint_path(session.directory, run.step)),
                    "weights_sha256": weights_sha256(session.model),
                }
                run.state = "done"
                rank, loss = run.request.rank, run.losses[-1:] or None
                log.info("train_rank_done", rank=rank, step=run.step, loss=loss)
            if run.state != "done":  # cancelled by stop
                run.error, failed = "stopped", True
        except Exception as exc:  # reported by progress; the driver decides about a restart
            failed = True
            run.error = "stopped" if isinstance(exc, Stopped) else f"{type(exc).__name__}: {exc}"
            run.error_final = _fails_again(exc, session)
            if not isinstance(exc, Stopped):  # a stop is logged as the rank checkpoints it, below
                # At error where no restart can help: the run ends on it (the driver's train_failed).
                failed_at = log.error if run.error_final else log.warning
                failed_at("train_rank_failed", rank=run.request.rank, step=run.step, error=run.error,
                          final=run.error_final)  # fmt: skip
        finally:
            try:
                with anyio.CancelScope(shield=True):
                    # One rank only: with several, a checkpoint is a collective every rank must join
                    # at the same step, and a stop reaches them between different steps.
                    if session is not None and run.error == "stopped" and run.request.world_size == 1:
                        rank = run.request.rank
                        try:
                            saved = await anyio.to_thread.run_sync(session.checkpoint_stopped)
                            log.info("train_rank_stopped", rank=rank, step=run.step, checkpoint=saved)
                        except Exception as exc:
                            log.warning("train_rank_stop_checkpoint_failed", rank=rank, error=repr(exc))
                    if session is not None:
                        await anyio.to_thread.run_sync(session.close)
                    if joined:
                        await anyio.to_thread.run_sync(close_ranks)
            finally:
                # Failed only once a checkpoint in flight has committed (session.close): the
                # driver restarts from the last one, and progress names it.
                if failed:
                    run.state = "failed"
                run.ended.set()

    async def _join(self, request: StartRequest) -> None:
        """Join the ranks' process group, rank 0 publishing where through the directory."""
        rdv = await rendezvous_from(
            self.runtime, request.rendezvous, request.rank, request.world_size, host=request.host
        )
        await anyio.to_thread.run_sync(init_ranks, rdv)

    async def _session(self, run: RankRun) -> RankSession:
        """The run's objects, built on a worker thread. A dataset this rank does not find is said
        as its host's: the run found it on its own host, and its advice (pass the folder `troupe
        run --out` wrote) did not fit a rank on another host."""
        try:
            return await anyio.to_thread.run_sync(RankSession, run)
        except DatasetNotFound as exc:
            raise DatasetNotFound(
                f"node {self.runtime.node} has no dataset at train.dataset {exc.root} (neither "
                "meta/info.json nor .troupe/episodes there): every rank's host needs it at that "
                "same path (a shared file system, or a copy there)",
                exc.root,
            ) from exc

    async def _train(self, run: RankRun, session: RankSession) -> TrainResult:
        train = run.request.config.train
        config = InflightConfig(
            inflight=train.inflight, group_size=train.group_size, rank=run.request.rank,
            deadline_s=train.deadline_s, max_steps=max(0, train.steps - run.step),
        )  # fmt: skip
        if session.encoder is not None:
            return await anyio.to_thread.run_sync(
                train_local, session.batches, session.step, session.encoder, config
            )
        names = run.request.encoders
        encode = actor_encoder(self.runtime, names, params=session.params(), timeout=train.deadline_s)
        try:
            return await train_remote(session.batches, session.step, encode, len(names), config)
        except GroupFailed as exc:  # name the actors: the error counts them by index
            raise GroupFailed(f"{exc} (encoder actors, by index: {', '.join(names)})") from exc


def _with_threads(request: StartRequest, threads: int) -> StartRequest:
    trainers = request.config.trainers.model_copy(update={"threads": threads})
    config = request.config.model_copy(update={"trainers": trainers})
    return StartRequest(config, request.out, request.rank, request.world_size, request.encoders,
                        request.rendezvous, request.host)  # fmt: skip


def _fails_again(exc: Exception, session: RankSession | None) -> bool:
    """Whether a restart from the last checkpoint would fail the same way: a loss that diverged,
    a dataset too small for the run that cannot grow (finalized), a damaged last checkpoint, a
    damaged file of the dataset, a dataset not on this rank's host, a checkpoint whose sampler
    cannot go on over this run's data, a peer that gave gloo a loopback address across hosts."""
    if isinstance(exc, (LossNotFinite, DatasetDamaged, DatasetNotFound, ResumeMismatch, RanksUnreachable)):
        return True
    if isinstance(exc, (NotEnoughEpisodes, CheckpointUnreadable, CheckpointSaveFailed)):
        return exc.final
    if isinstance(exc, TooFewClips):
        dataset: Any = session.dataset if session is not None else None
        mode = getattr(dataset, "mode", None)
        # A run's folder grows while its pipeline writes it: one nobody writes (its journal's
        # lock free) is as final as a finalized dataset (three restarts burnt out in seconds).
        return mode == "finalized" or (mode == "store" and not being_written(Path(dataset.root)))
    return False
