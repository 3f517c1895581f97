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
through their nodes, the local node last. A second run into the same ``out`` resumes from its
checkpoints; ``fresh=True`` deletes what the run wrote (checkpoints, logs, the latent cache
inside ``out``) and starts over.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import structlog

from troupe.runtime import TroupeError, UnknownActor
from troupe.runtime.core.client import connect
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import ConfigError
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.config import KindSupervision, NodeConfig, SupervisionConfig
from troupe.runtime.node.local import start_local_node
from troupe.runtime.placement import Host, cluster_hosts, place

__all__ = [
    "ENCODER_CLASS",
    "TRAINER_CLASS",
    "TrainProgress",
    "TrainRunResult",
    "TrainingFailed",
    "run_training",
    "run_training_sync",
]

log = structlog.get_logger(__name__)

ENCODER_CLASS = "troupe.actors.encoders.encoder_actor:EncoderActor"
TRAINER_CLASS = "troupe.actors.training.trainer:TrainerActor"

_KINDS = {
    # A train step may keep the trainer's loop busy for long: no progress bound, a long beat grace.
    "trainer": KindSupervision(progress_timeout_s=0.0, heartbeat_timeout_s=30.0),
    "encoder": KindSupervision(progress_timeout_s=300.0, heartbeat_timeout_s=30.0),
}
_POLL_S = 0.5
_ASK_S = 20.0
_SPAWN_S = 120.0
_LOST_AFTER_S = 120.0  # a rank that answers nothing this long is restarted as if it answered idle


class TrainingFailed(TroupeError):
    """The ranks failed more often than ``train.max_restarts`` allows, or a rank could not start."""


@dataclass(frozen=True)
class TrainProgress:
    """What ``on_progress`` is told at every poll (rank 0's figures)."""

    step: int
    steps: int
    loss: float | None
    samples_per_s: float
    checkpoint: int | None  # the step of the last committed checkpoint
    restarts: int
    states: tuple[str, ...]


@dataclass
class TrainRunResult:
    """What a training run did.

    Attributes:
        steps: the steps trained (rank 0's last step).
        losses: rank 0's loss per step of the last (re)start: steps ``first_step + 1`` on (a
            restart or a rerun continues from the last committed checkpoint).
        loss: the last loss.
        samples_per_s: samples per second over all ranks.
        timings: per rank, ``read_s``, ``wait_s``, ``train_s``.
        requests: sample groups each encoder actor answered.
        restarts: times the ranks were started again.
        checkpoints: the committed checkpoint folders, oldest first.
        placement: actor name -> node name.
        wall_s: seconds from the call to the end.
        resumed_from: the step of an earlier run's checkpoint this run resumed from, or None.
        first_step: the step the last (re)start resumed from (0 when it started afresh).
        datagen: the data generation run's figures, when it ran beside.
    """

    steps: int
    losses: list[float]
    loss: float | None
    samples_per_s: float
    timings: dict[str, dict[str, float]]
    requests: dict[str, int]
    restarts: int
    checkpoints: list[str]
    placement: dict[str, str]
    wall_s: float
    resumed_from: int | None = None
    first_step: int = 0
    datagen: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """The result as JSON data (``troupe run --json``)."""
        return asdict(self)


# -- the run --------------------------------------------------------------------------------------


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

    Raises:
        ConfigError: the config is invalid, the dataset is missing, or no host fits.
        TrainingFailed: the ranks failed more than ``train.max_restarts`` times.
    """
    t0 = time.perf_counter()
    say = on_event or (lambda _line: None)
    cfg, out_dir = await anyio.to_thread.run_sync(_prepare, config, out, steps, fresh)
    log_dir = out_dir / "logs"
    if not structlog.is_configured():
        configure_logging("local", "train", log_dir, console=False)
    async with _training_cluster(master, node_endpoint, log_dir) as (rt, hosts):
        run = _Run(rt, cfg, out_dir, hosts, say, on_progress)
        try:
            result = await run.main(fresh)
        finally:
            if master is not None:  # a node started here stops its workers itself, then stops
                with anyio.CancelScope(shield=True):
                    await _stop_remote(master, run.spawned)
    result.wall_s = time.perf_counter() - t0
    return result


def run_training_sync(config: Any, out: str | os.PathLike[str], **kwargs: Any) -> TrainRunResult:
    """:func:`run_training` from synchronous code (its own event loop)."""

    async def main() -> TrainRunResult:
        return await run_training(config, out, **kwargs)

    return anyio.run(main, backend="asyncio")


# -- before anything starts -----------------------------------------------------------------------


def _prepare(config: Any, out: str | os.PathLike[str], steps: int | None, fresh: bool) -> tuple[Any, Path]:
    from .train_config import TrainConfig, load_train_config

    cfg = config if isinstance(config, TrainConfig) else load_train_config(config)
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"steps={steps!r}: expected an integer >= 1")
        cfg = _with_steps(cfg, steps)
    out_dir = Path(out).resolve()
    cfg = cfg.with_out(out_dir)
    # Workers may run elsewhere than this process's folder: relative paths are this folder's.
    train = cfg.train.model_copy(
        update={k: str(Path(getattr(cfg.train, k)).resolve()) for k in ("dataset", "checkpoint_dir")}
    )
    cfg = cfg.model_copy(update={"train": train})
    if fresh:
        _delete_written(cfg, out_dir)
    if cfg.datagen is None:
        _check_dataset(Path(cfg.train.dataset))
    else:  # refused now, not after the workers started
        from troupe.runtime.pipeline.config import load_pipeline

        load_pipeline(Path(cfg.datagen.pipeline), items=cfg.datagen.items)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "logs").mkdir(exist_ok=True)
    return cfg, out_dir


def _with_steps(cfg: Any, steps: int) -> Any:
    train = cfg.train.model_copy(update={"steps": steps})
    return cfg.model_copy(update={"train": train})


def _delete_written(cfg: Any, out_dir: Path) -> None:
    """Checkpoints, logs, and the latent cache where it lies inside ``out``: what a run wrote."""
    for path in (Path(cfg.train.checkpoint_dir), out_dir / "logs", Path(cfg.encoders.cache_dir)):
        if path.is_dir() and (path == out_dir / "logs" or out_dir in path.resolve().parents):
            shutil.rmtree(path)


def _check_dataset(path: Path) -> None:
    if not path.exists():
        raise ConfigError(
            f"train.dataset: no dataset at {path}; make one first: "
            f"troupe run configs/datagen.toml --out {path}"
        )
    if not ((path / "meta" / "info.json").is_file() or (path / ".troupe" / "episodes").is_dir()):
        raise ConfigError(
            f"train.dataset: {path} is not a LeRobot dataset nor a troupe run's folder; "
            f"make one: troupe run configs/datagen.toml --out {path}"
        )


# -- the cluster ----------------------------------------------------------------------------------


def _free_endpoint() -> str:
    from troupe.runtime.pipeline.runner import _free_endpoint as free

    return free()


@asynccontextmanager
async def _training_cluster(
    master: str | None, node_endpoint: str | None, log_dir: Path
) -> AsyncIterator[tuple[Runtime, list[Host]]]:
    """A runtime and the hosts to place workers on; a node started here is stopped on the way out."""
    if master is not None:
        async with connect(master) as rt:
            yield rt, await cluster_hosts(rt, master)
        return
    async with anyio.create_task_group() as tg:
        node_cfg = NodeConfig(
            name="local",
            endpoint=node_endpoint or _free_endpoint(),
            log_dir=log_dir,
            stop_grace_s=10,
            supervision=SupervisionConfig(kinds=_KINDS),
        )
        node = await start_local_node(tg, node_cfg)
        try:
            async with connect(node_cfg.endpoint, "local") as rt:
                yield rt, [Host.anything("local", node_cfg.endpoint, _local_gpus())]
        finally:
            with anyio.CancelScope(shield=True):
                node.stopping.set()
                with anyio.move_on_after(node_cfg.stop_grace_s + 30):
                    await node.stopped.wait()


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


async def _stop_worker(rt: Runtime, worker: str, host: Host) -> None:
    with contextlib.suppress(TroupeError, OSError):
        await rt.control(host.endpoint, "stop_worker", {"name": worker}, timeout=60)


async def _stop_remote(master: str, spawned: list[tuple[str, Host]]) -> None:
    """Stop the workers spawned on the cluster's nodes, in parallel, each within its node's stop
    grace; through a runtime of its own, as the run's may be cancelled (Ctrl-C) by now."""
    async with connect(master) as rt, anyio.create_task_group() as tg:
        for worker, host in list(spawned):
            tg.start_soon(_stop_worker, rt, worker, host)


# -- one run on the cluster -----------------------------------------------------------------------


@dataclass
class _Rank:
    index: int
    worker: str
    actor: str
    host: Host
    last: dict[str, Any] = field(default_factory=dict)
    silent_since: float | None = None


class _Run:
    """The workers of one training run, their starts, polls and restarts."""

    def __init__(
        self,
        rt: Runtime,
        cfg: Any,
        out: Path,
        hosts: list[Host],
        say: Callable[[str], None],
        on_progress: Callable[[TrainProgress], None] | None,
    ) -> None:
        self.rt, self.cfg, self.out, self.say, self.on_progress = rt, cfg, out, say, on_progress
        enc, tr = cfg.encoders, cfg.trainers
        local = cfg.train.local_encoding  # the ranks encode themselves: no encoder actors
        enc_hosts = [] if local else place(enc.count, hosts, enc.tags, enc.gpus, what="encoders")
        rank_hosts = place(tr.ranks, hosts, tr.tags, tr.gpus, what="trainers")
        self.encoders = [(f"train-encode-{i}", f"w-train-encode-{i}", h) for i, h in enumerate(enc_hosts)]
        self.ranks = [_Rank(r, f"w-train-rank-{r}", f"train-rank-{r}", h) for r, h in enumerate(rank_hosts)]
        self.spawned: list[tuple[str, Host]] = []
        self.restarts = 0
        self.resumed_from: int | None = None
        self.first_step = 0
        self.datagen: dict[str, Any] | None = None

    @property
    def placement(self) -> dict[str, str]:
        return {**{a: h.name for a, _, h in self.encoders}, **{r.actor: r.host.name for r in self.ranks}}

    # -- workers ----------------------------------------------------------------------------------

    async def _spawn(
        self, worker: str, kind: str, actor: str, cls: str, kwargs: dict[str, Any], host: Host
    ) -> None:
        spec = {"name": worker, "kind": kind, "actors": [{"name": actor, "class": cls, "kwargs": kwargs}]}
        await self.rt.control(
            host.endpoint, "spawn_worker", {**spec, "timeout_s": _SPAWN_S}, timeout=_SPAWN_S + 10
        )
        self.spawned.append((worker, host))
        log.info("train_worker_spawned", worker=worker, kind=kind, node=host.name)

    async def _stop_worker(self, worker: str, host: Host) -> None:
        await _stop_worker(self.rt, worker, host)
        with contextlib.suppress(ValueError):
            self.spawned.remove((worker, host))

    def _encoder_kwargs(self) -> dict[str, Any]:
        enc = self.cfg.encoders
        kwargs = {
            "encoder": enc.encoder,
            "encoder_kwargs": dict(enc.encoder_kwargs),
            "weights": enc.weights,
            "memory_mb": enc.memory_mb,
            "disk_mb": enc.disk_mb,
            "cache_dir": enc.cache_dir,
            "threads": enc.threads,
        }
        return {k: v for k, v in kwargs.items() if v is not None}

    def _trainer_kwargs(self) -> dict[str, Any]:
        threads = self.cfg.trainers.threads
        return {} if threads is None else {"threads": threads}

    async def _spawn_encoders(self) -> None:
        kwargs = self._encoder_kwargs()
        async with anyio.create_task_group() as tg:
            for actor, worker, host in self.encoders:
                tg.start_soon(self._spawn, worker, "encoder", actor, ENCODER_CLASS, kwargs, host)

    async def _spawn_rank(self, rank: _Rank) -> None:
        await self._spawn(
            rank.worker, "trainer", rank.actor, TRAINER_CLASS, self._trainer_kwargs(), rank.host
        )

    # -- the run ----------------------------------------------------------------------------------

    async def main(self, fresh: bool) -> TrainRunResult:
        self.say(
            f"placing {len(self.encoders)} encoder actor(s) and {len(self.ranks)} rank(s): "
            + ", ".join(f"{a} on {n}" for a, n in self.placement.items())
        )
        async with anyio.create_task_group() as tg:
            datagen_done = anyio.Event()
            if self.cfg.datagen is not None:
                tg.start_soon(self._datagen, fresh, datagen_done)
            await self._spawn_encoders()
            async with anyio.create_task_group() as spawn:
                for rank in self.ranks:
                    spawn.start_soon(self._spawn_rank, rank)
            if self.cfg.datagen is not None:
                await self._wait_episodes(datagen_done)
            final = await self._train()
        return await self._result(final)

    async def _start_ranks(self, attempt: int) -> None:
        payload = {
            "config": self.cfg.to_data(),
            "out": str(self.out),
            "world_size": len(self.ranks),
            "encoders": [a for a, _, _ in self.encoders],
            "rendezvous": f"train-rendezvous-{attempt}",
            "host": _reachable_host(self.ranks[0].host.endpoint),
        }
        replies = [
            await self._ask_new(rank.actor, "start", {**payload, "rank": rank.index}) for rank in self.ranks
        ]
        resumed = replies[0].get("resumed_from") if isinstance(replies[0], dict) else None
        self.first_step = int(resumed or 0)
        where = f"step {resumed} (checkpoints in {self.cfg.train.checkpoint_dir})"
        if attempt == 0 and resumed is not None:
            self.resumed_from = int(resumed)
            self.say(f"resuming from {where}")
        elif attempt > 0:
            self.say(f"ranks started again from {where if resumed is not None else 'the start'}")
        for rank in self.ranks:
            rank.last, rank.silent_since = {}, None

    async def _ask_new(self, actor: str, msg_type: str, payload: Any) -> Any:
        """Ask an actor just spawned: a master learns of it from its node's next beat, so an
        unknown name is asked again for a while."""
        deadline = time.monotonic() + _SPAWN_S
        while True:
            try:
                return await self.rt.ref(actor).ask(msg_type, payload, timeout=_ASK_S * 3)
            except UnknownActor:
                if time.monotonic() > deadline:
                    raise
                await anyio.sleep(0.2)

    async def _train(self) -> list[dict[str, Any]]:
        """Start the ranks and poll them to the end; restart them all when one is lost."""
        limit = int(self.cfg.train.max_restarts)
        attempt = 0
        await self._start_ranks(attempt)
        while True:
            await anyio.sleep(_POLL_S)
            lost = await self._poll()
            if lost is None:
                if all(r.last.get("state") == "done" for r in self.ranks):
                    return [r.last for r in self.ranks]
                continue
            errors = "; ".join(
                f"rank {r.index}: {r.last.get('error') or r.last.get('state') or 'no answer'}"
                for r in self.ranks
                if r.last.get("state") != "running"
            )
            if self.restarts >= limit:
                raise TrainingFailed(
                    f"training failed after {self.restarts} restart(s) "
                    f"(train.max_restarts = {limit}): {lost}; {errors}"
                )
            self.restarts += 1
            attempt += 1
            log.warning(
                "train_restart", restart=self.restarts, max_restarts=limit, reason=lost, errors=errors
            )
            self.say(f"{lost}; restarting every rank from the last checkpoint ({self.restarts}/{limit})")
            await self._respawn_ranks()
            await self._start_ranks(attempt)

    async def _poll(self) -> str | None:
        """Ask every rank for its progress; the reason to restart, or None."""
        now = time.monotonic()
        for rank in self.ranks:
            try:
                reply = await self.rt.ref(rank.actor).ask("progress", None, timeout=_ASK_S)
            except TroupeError:
                rank.silent_since = rank.silent_since or now
                if now - rank.silent_since > _LOST_AFTER_S:
                    return f"rank {rank.index} answered nothing for {_LOST_AFTER_S:g} s"
                continue
            rank.silent_since = None
            rank.last = dict(reply) if isinstance(reply, dict) else {}
            state = rank.last.get("state")
            if state == "failed":
                return f"rank {rank.index} failed: {rank.last.get('error')}"
            if state == "idle":
                return f"rank {rank.index} lost its worker (restarted by its node)"
        self._record()
        return None

    def _record(self) -> None:
        head = self.ranks[0].last
        step, loss = int(head.get("step") or 0), head.get("loss")
        if self.on_progress is not None and head:
            self.on_progress(
                TrainProgress(
                    step=step,
                    steps=int(head.get("steps") or self.cfg.train.steps),
                    loss=None if loss is None else float(loss),
                    samples_per_s=sum(float(r.last.get("samples_per_s") or 0.0) for r in self.ranks),
                    checkpoint=None if head.get("checkpoint") is None else int(head["checkpoint"]),
                    restarts=self.restarts,
                    states=tuple(str(r.last.get("state", "?")) for r in self.ranks),
                )
            )

    async def _respawn_ranks(self) -> None:
        """Every rank's worker stopped (a rank left in a collective would hang) and started again."""
        async with anyio.create_task_group() as tg:
            for rank in self.ranks:
                tg.start_soon(self._stop_worker, rank.worker, rank.host)
        async with anyio.create_task_group() as tg:
            for rank in self.ranks:
                tg.start_soon(self._spawn_rank, rank)

    # -- data generation beside ---------------------------------------------------------------

    async def _datagen(self, fresh: bool, done: anyio.Event) -> None:
        from troupe.runtime.pipeline.runner import run_pipeline

        dg = self.cfg.datagen
        node = self.ranks[0].host.endpoint
        try:
            result = await run_pipeline(
                dg.pipeline,
                self.cfg.train.dataset,
                items=dg.items,
                node=node,
                fresh=fresh,
                keep_outputs=False,
            )
            self.datagen = {
                "items": result.counts(),
                "elapsed_s": result.metrics.elapsed_s,
                "finals": result.finals,
            }
            self.say(f"data generation done: {result.counts()}")
        finally:
            done.set()

    async def _wait_episodes(self, datagen_done: anyio.Event) -> None:
        from .dataset import committed_episodes

        wanted = int(self.cfg.train.min_episodes)
        self.say(f"waiting for {wanted} committed episode(s) in {self.cfg.train.dataset}")
        while True:
            have = await anyio.to_thread.run_sync(committed_episodes, self.cfg.train.dataset)
            if have >= wanted:
                self.say(f"{have} episode(s) committed; starting the ranks")
                return
            if datagen_done.is_set():
                raise TrainingFailed(
                    f"data generation ended with {have} committed episode(s), fewer than "
                    f"train.min_episodes = {wanted}"
                )
            await anyio.sleep(_POLL_S)

    # -- the end ----------------------------------------------------------------------------------

    async def _result(self, final: list[dict[str, Any]]) -> TrainRunResult:
        head = final[0]
        result: dict[str, Any] = head["result"] if isinstance(head.get("result"), dict) else {}
        losses = self._losses(result)
        timings = {str(r.index): _timings(r.last) for r in self.ranks}
        requests: dict[str, int] = {}
        for actor, _, _ in self.encoders:
            try:
                stats = await self.rt.ref(actor).ask("stats", None, timeout=_ASK_S)
                requests[actor] = int(stats.get("groups", 0))
            except TroupeError:
                requests[actor] = -1
        return TrainRunResult(
            steps=int(head.get("step") or 0),
            losses=losses,
            loss=losses[-1] if losses else None,
            samples_per_s=sum(float(r.last.get("samples_per_s") or 0.0) for r in self.ranks),
            timings=timings,
            requests=requests,
            restarts=self.restarts,
            checkpoints=_committed_checkpoints(Path(self.cfg.train.checkpoint_dir)),
            placement=self.placement,
            wall_s=0.0,
            resumed_from=self.resumed_from,
            first_step=self.first_step,
            datagen=self.datagen,
        )

    def _losses(self, result: dict[str, Any]) -> list[float]:
        """Rank 0's losses of the last (re)start: steps ``first_step + 1`` to the end."""
        return [float(x) for x in result.get("losses") or []]


def _reachable_host(endpoint: str) -> str:
    """The address other hosts reach a node at, from its endpoint (loopback for a wildcard)."""
    host = urlsplit(endpoint).hostname or "127.0.0.1"
    return "127.0.0.1" if host in ("0.0.0.0", "*", "::") else host


def _timings(progress: dict[str, Any]) -> dict[str, float]:
    t = progress.get("timings") or {}
    return {k: float(t.get(k) or 0.0) for k in ("read_s", "wait_s", "train_s")}


def _committed_checkpoints(directory: Path) -> list[str]:
    from .checkpoint import COMMITTED

    if not directory.is_dir():
        return []
    return [str(p) for p in sorted(directory.glob("step-*")) if (p / COMMITTED).is_file()]
