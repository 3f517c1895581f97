"""Run training from Python: the API behind ``troupe run configs/train.toml``.

::

    from troupe.actors.training.train_run import run_training_sync

    result = run_training_sync("configs/train.toml", out="train-out", steps=50)
    print(result.loss, result.samples_per_s, result.checkpoints)

What it starts, and where:

- without ``master``: a one-host cluster in this process (a node on a free loopback port, as
  ``troupe run`` starts for a pipeline), which carries every tag;
- ``master=ENDPOINT``: the live nodes that joined that master, each with the tags of its
  ``[node] tags``; nothing but the workers below is started.

``encoders.count`` :class:`~troupe.actors.encoders.encoder_actor.EncoderActor` workers (kind
``encoder``) and ``trainers.ranks`` :class:`~troupe.actors.training.trainer.TrainerActor` workers
(kind ``trainer``) are placed on the hosts that carry their ``tags`` and ``gpus``
(:func:`troupe.runtime.placement.place`) and spawned through each host's node. Every rank is
sent ``start`` and polled for ``progress``. A rank that fails, or whose worker died (the node
restarts it, and it then answers ``idle``), makes the driver stop every rank's worker and start
them all again: they resume from the latest committed checkpoint, at most ``train.max_restarts``
times; then the run fails with the ranks' errors.

The local node disables the no-progress check for trainer workers (a train step may hold the
event loop longer than any fixed bound) and gives both kinds a long heartbeat grace; nodes of a
cluster should set the same under ``[supervision.kinds.trainer]`` (``progress_timeout_s = 0``).

With a ``[datagen]`` table, the data generation pipeline runs beside the training on the same
node, into ``train.dataset`` (``{out}/data`` in configs/datagen-train.toml), and the ranks start once
``train.min_episodes`` episodes are committed; they read the growing run folder.

Everything started here is stopped on the way out (done, failed or cancelled): the workers
through their nodes, the local node last. A cancellation that comes once the ranks were done
(their final checkpoint committed), as those stop, stopped nothing: the run returns its result
rather than raising it. A second run into the same ``out`` resumes from its
checkpoints; ``fresh=True`` deletes what the run wrote (checkpoints, logs, the latent cache
inside ``out``) and starts over.

The parts: :mod:`.train_prepare` (the config and ``out`` before anything starts),
:mod:`.train_cluster` (the runtime and hosts, the local node), :mod:`.train_driver` (the workers,
their polls and restarts; its parts :mod:`.train_workers`, :mod:`.worker_moves` and
:mod:`.train_end`), :mod:`.train_datagen` (the pipeline beside), :mod:`.train_result` (what
a run reports).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio

from troupe.runtime.errors import leaf_errors
from troupe.runtime.last_words import last_words
from troupe.runtime.library_logging import get_logger
from troupe.runtime.logs import run_log
from troupe.runtime.transports.loopback import moved_line

from .train_cluster import check_master, stop_remote, training_cluster
from .train_driver import ENCODER_CLASS, TRAINER_CLASS, TrainDriver
from .train_prepare import prepare_run
from .train_result import TrainingFailed, TrainProgress, TrainRunResult, committed_checkpoints

__all__ = [
    "ENCODER_CLASS",
    "TRAINER_CLASS",
    "TrainProgress",
    "TrainRunResult",
    "TrainingFailed",
    "run_training",
    "run_training_sync",
]

log = get_logger(__name__)


async def run_training(
    config: Any,
    out: str | os.PathLike[str],
    *,
    steps: int | None = None,
    master: str | None = None,
    on_progress: Callable[[TrainProgress], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    fresh: bool = False,
    node_endpoint: str | None = None,
    endpoint_may_move: bool = False,
    keys: str | os.PathLike[str] | None = None,
) -> TrainRunResult:
    """Train as ``config`` (a path, a dict, or a ``TrainConfig``) says, into ``out``.

    Args:
        config: the training config.
        out: the run's folder: checkpoints, logs, the latent cache (and ``data`` with datagen).
        steps: overrides ``train.steps``.
        master: a running master whose live nodes run the workers (default: a node here).
        on_progress: called with rank 0's figures at every poll.
        on_event: called with a line for what the user should know (a resume, a restart).
        fresh: delete what an earlier run wrote into ``out`` first.
        node_endpoint: where the node started here listens (default: a free loopback port).
        endpoint_may_move: ``node_endpoint`` is a default found free before the run: taken since
            (another run started at once), the node listens on a free port of its host instead,
            said through ``on_event``, rather than failing the run (as ``run_pipeline``'s
            ``endpoints_may_move``).
        keys: with ``master``, the cluster's CURVE keys directory (default ``$TROUPE_KEYS``).

    Raises:
        ConfigError: the config is invalid, the dataset is missing, no host fits, or ``out`` is
            another run's now, holds checkpoints of another model or trained on another
            dataset, or someone else's files.
        TrainingFailed: the ranks failed more than ``train.max_restarts`` times.
        Unreachable: the master did not answer, or refused the keys (or their lack): said before
            anything is made in ``out``.
    """
    t0 = time.perf_counter()
    say = _logged(on_event or (lambda _line: None))
    if master is not None:
        await check_master(master, keys)
    cfg, out_dir, held, lines = await anyio.to_thread.run_sync(prepare_run, config, out, steps, fresh)
    done: list[TrainRunResult] = []  # the result, once the ranks were done (final checkpoint committed)
    driver: list[TrainDriver] = []  # the run's driver, once made: the step it saw, for the log
    ended: list[str] = []  # how the run ended, once logged: a stop at once logs no second end

    def at_once() -> str:
        """A stop at once (``runtime/last_words.py``): the log's end, and the line to say."""
        if not ended:
            ended.append("stopped")
            _log_stopped(cfg, driver[0].step if driver else 0, at_once=True)
        return _stopped_at_once_line(cfg, master is not None)

    try:
        log_dir = out_dir / "logs"
        with run_log("local", "train") as logs, last_words(at_once):  # the run's file closed as it ends
            if logs is not None:
                logs.write_to(log_dir)
            for line in lines:  # said once the run's log is its file: they are logged too
                say(line)
            try:
                async with (
                    _kept_once_trained(done),
                    training_cluster(master, node_endpoint, out_dir, endpoint_may_move, keys) as (rt, hosts),
                ):
                    if master is None and node_endpoint is not None and hosts[0].endpoint != node_endpoint:
                        say(moved_line(node_endpoint, hosts[0].endpoint))
                    run = TrainDriver(rt, cfg, out_dir, hosts, say, on_progress, master)
                    driver.append(run)
                    try:
                        done.append(await run.main(fresh))
                    finally:
                        if master is not None:  # a node started here stops its workers itself, then stops
                            with anyio.CancelScope(shield=True):
                                await stop_remote(master, run.to_stop, keys)
            except anyio.get_cancelled_exc_class():
                # Once the workers stopped: each rank checkpointed the step it stopped at.
                if not ended:
                    ended.append("stopped")
                    _log_stopped(cfg, driver[0].step if driver else 0)
                raise
            except Exception as exc:
                ended.append("failed")
                log.error("train_failed", step=driver[0].step if driver else 0, error=_said_error(exc))
                raise
            ended.append("finished")
            result = done[0]
            result.wall_s = time.perf_counter() - t0
            log.info("train_finished", step=result.steps, steps_this_run=result.steps_this_run,
                     resumed_from=result.resumed_from, loss=result.loss,
                     samples_per_s=round(result.samples_per_s, 3), restarts=result.restarts,
                     checkpoint=result.checkpoints[-1] if result.checkpoints else None,
                     wall_s=round(result.wall_s, 3))  # fmt: skip
    finally:
        # out is free for the next run (the kernel frees it too, if this dies), and this code is
        # taken back from its record where the run committed no checkpoint
        held.release()
    return result


def _logged(say: Callable[[str], None]) -> Callable[[str], None]:
    """``say``, each line logged too (``train_said``): the run's log is its durable record, and
    the terminal's lines (a resume, a restart, other code's checkpoints) are part of it."""

    def both(line: str) -> None:
        log.info("train_said", line=line)
        say(line)

    return both


def _log_stopped(cfg: Any, step: int, at_once: bool = False) -> None:
    """``train_stopped``: the step rank 0 was last seen at, and the newest committed checkpoint
    (the one a rerun resumes from; None where none is, or its folder is not this host's);
    ``at_once``: a second stop signal ended the run without its clean-up."""
    at, last = _newest_committed(cfg)
    log.info(
        "train_stopped",
        step=step,
        checkpoint_step=at,
        checkpoint=last,
        **({"at_once": True} if at_once else {}),
    )


def _newest_committed(cfg: Any) -> tuple[int | None, str | None]:
    """The step and folder of the newest committed checkpoint on disk (None, None: none)."""
    newest = committed_checkpoints(Path(cfg.train.checkpoint_dir))
    last = newest[-1] if newest else None
    return (None if last is None else int(Path(last).name.removeprefix("step-"))), last


def _stopped_at_once_line(cfg: Any, on_cluster: bool) -> str:
    """What a stop at once says of the run (after ``stopped at once: ``), as a graceful stop
    does: the newest committed checkpoint, read from the disk, which a rerun resumes from; on a
    cluster, that the workers were asked to stop (none of them is this host's to kill)."""
    at, last = _newest_committed(cfg)
    where = (
        "no checkpoint was committed: the same command run again starts at step 0"
        if last is None
        else f"checkpoint at step {at} in {last}; the same command run again resumes from it"
    )
    if not on_cluster:
        return where
    return (
        f"{where}; its ranks and encoders on the cluster's nodes were asked to stop, and their "
        "nodes stop them as this run is gone (a rank may commit a later checkpoint as it stops)"
    )


def _said_error(exc: BaseException) -> str:
    """The run's error as one line: each error inside its exception groups, by class."""
    return "; ".join(f"{type(e).__name__}: {e}" for e in leaf_errors(exc))


@contextlib.asynccontextmanager
async def _kept_once_trained(done: list[TrainRunResult]) -> AsyncIterator[None]:
    """A stop (the run's cancellation) that comes once ``done`` holds the run's result, taken as
    stopping nothing: the training was complete (its final checkpoint committed), and it lands
    as the workers and the node stop, which see to their own stop all the same. The run returns
    its result rather than raising; the stop is the caller's to see (its cancel scope stays
    cancelled): ``troupe run`` says the training was complete when it came."""
    try:
        yield
    except anyio.get_cancelled_exc_class():
        if not done:
            raise


def run_training_sync(config: Any, out: str | os.PathLike[str], **kwargs: Any) -> TrainRunResult:
    """:func:`run_training` from synchronous code (its own event loop)."""

    async def main() -> TrainRunResult:
        return await run_training(config, out, **kwargs)

    return anyio.run(main, backend="asyncio")
