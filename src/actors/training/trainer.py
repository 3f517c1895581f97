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

import hashlib
import importlib
import math
import shutil
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
import torch
from torch import nn

from troupe.actors.encoders.encoder_actor import load_encoder
from troupe.models.world_model import FlowBatch, WorldModel
from troupe.runtime import Actor, ConfigError, handles

from .checkpoint import COMMITTED, Checkpointer, checkpoint_path, latest, load
from .dataset import ResumableSampler, clip_batches
from .inflight import (
    GroupFailed,
    InflightConfig,
    StageTimings,
    TrainResult,
    actor_encoder,
    train_local,
    train_remote,
)
from .ranks import Rendezvous, close_ranks, init_ranks, rendezvous_from
from .train_config import TrainConfig, load_train_config

__all__ = ["RankRun", "StartRequest", "TrainerActor", "lr_lambda", "sample_seed", "weights_sha256"]

log = structlog.get_logger(__name__)

RENDEZVOUS_CLASS = "troupe.actors.training.ranks:RendezvousActor"

LOG_EVERY = 10
STOP_WAIT_S = 4.0
"""Seconds a stopping worker waits for its run to end and checkpoint: under a node's default
stop grace (5 s), after which the node kills the worker."""
"""Steps between progress log lines."""


class _Stopped(Exception):
    """The run was stopped by request (raised in the train step, after the step before)."""


def lr_lambda(config: TrainConfig) -> Any:
    """The LR factor of step ``s``: linear warmup, then cosine to 0 at ``steps`` (or constant)."""
    warmup, steps, cosine = config.train.warmup_steps, config.train.steps, config.train.schedule == "cosine"

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        if not cosine:
            return 1.0
        done = min(1.0, (s - warmup) / max(1, steps - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * done))

    return factor


def sample_seed(seed: int, step: int, index: int) -> int:
    """Seed of one sample's flow noise and time: its clip, the step and the run's seed, nothing
    else (not the rank, nor the batch it sits in)."""
    digest = hashlib.blake2b(f"{seed}:{step}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def weights_sha256(model: nn.Module) -> str:
    """sha256 of the model's state dict (names, dtypes, shapes and bytes, by name)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class StartRequest:
    """A validated ``start`` payload."""

    config: TrainConfig
    out: str
    rank: int
    world_size: int
    encoders: tuple[str, ...]
    rendezvous: str
    host: str = "127.0.0.1"

    @classmethod
    def parse(cls, payload: Any) -> StartRequest:
        """Raises ConfigError naming the missing or bad field."""
        if not isinstance(payload, dict):
            raise ConfigError(f"start: expected a map payload, got {type(payload).__name__}")
        for key in ("config", "out", "rank", "world_size"):
            if key not in payload:
                raise ConfigError(f"start: missing {key!r}")
        out = payload["out"]
        if not isinstance(out, str) or not out:
            raise ConfigError(f"start: out={out!r}: expected a folder path")
        config = load_train_config(payload["config"]).with_out(out)
        world_size, rank = payload["world_size"], payload["rank"]
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ConfigError(f"start: world_size={world_size!r}: expected an integer >= 1")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
            raise ConfigError(f"start: rank={rank!r}: expected 0..{world_size - 1}")
        encoders = payload.get("encoders") or []
        if not isinstance(encoders, list | tuple) or not all(isinstance(e, str) and e for e in encoders):
            raise ConfigError(f"start: encoders={encoders!r}: expected a list of actor names")
        if not config.train.local_encoding and not encoders:
            raise ConfigError("start: encoders=[]: give encoder actors, or set train.local_encoding = true")
        rendezvous = payload.get("rendezvous") or "trainer-rendezvous"
        host = payload.get("host") or "127.0.0.1"
        if not isinstance(rendezvous, str) or not isinstance(host, str):
            raise ConfigError(f"start: rendezvous={rendezvous!r}, host={host!r}: expected strings")
        return cls(config, out, rank, world_size, tuple(encoders), rendezvous, host)


@dataclass
class RankRun:
    """What one run of this rank did so far (read by ``progress``)."""

    request: StartRequest
    state: str = "starting"
    step: int = 0
    start_step: int = 0
    resumed_from: int | None = None
    losses: list[float] = field(default_factory=list)
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    timings: StageTimings = field(default_factory=StageTimings)
    result: TrainResult | None = None
    error: str | None = None
    final: dict[str, Any] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    scope: anyio.CancelScope | None = None
    started_at: float = field(default_factory=time.perf_counter)
    ended: anyio.Event = field(default_factory=anyio.Event)


def _committed_step(directory: str) -> int | None:
    found = latest(directory)
    return int(found.name.split("-")[1]) if found is not None else None


def _import(path: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"train.dataset_class: cannot import {path!r}: {exc}") from exc
    return obj


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class _LossOf(nn.Module):
    """The world model's loss as a forward, so DDP's gradient hooks see it."""

    def __init__(self, model: WorldModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: FlowBatch, noise: tuple[torch.Tensor, torch.Tensor], t: torch.Tensor) -> Any:
        return self.model.loss(batch, noise=noise, t=t).loss


class _Session:
    """The objects of one run, built on a worker thread (model, optimizer, data, checkpointer)."""

    def __init__(self, run: RankRun) -> None:
        req = run.request
        cfg, train = req.config, req.config.train
        self.run = run
        self.threads = cfg.trainers.threads
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        # A GPU only where the config asks for one: on CPU the run is bit-reproducible.
        cuda = cfg.trainers.gpus > 0 and torch.cuda.is_available()
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if cuda else "cpu")
        torch.manual_seed(train.seed + req.rank)
        self.model = WorldModel(cfg.world_model()).to(self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=train.lr, weight_decay=train.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.loss_of: nn.Module = _LossOf(self.model)
        if req.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.loss_of = DistributedDataParallel(
                self.loss_of, device_ids=[self.device.index] if cuda else None
            )
        self.directory = train.checkpoint_dir
        # Collective: every rank makes it here, before anything is saved or loaded.
        self.checkpointer = Checkpointer(self.directory, train.checkpoint_every or train.steps)
        # The sampler's global position (exact on any number of ranks, a grown store included).
        sampler_state: dict[str, Any] | int = 0
        found = latest(self.directory)
        if found is not None:
            restored = load(found, self.model, self.optimizer, self.scheduler)
            run.start_step = run.step = int(restored.progress["step"])
            sampler_state = restored.progress.get("sampler", 0)
        dataset_cls = _import(train.dataset_class)
        self.dataset = dataset_cls(
            train.dataset,
            clip_frames=train.clip_frames,
            action_steps=train.action_steps,
            size=tuple(train.size) if train.size is not None else None,
            stride=train.stride,
            min_episodes=train.min_episodes,
        )
        self.sampler = ResumableSampler(
            self.dataset, train.batch_size, seed=train.seed, shuffle=True, rank=req.rank,
            world_size=req.world_size, start=sampler_state,
        )  # fmt: skip
        self.batches = clip_batches(self.dataset, train.batch_size, self.sampler, train.num_workers)
        self.encoder: nn.Module | None = None
        if train.local_encoding:
            enc = cfg.encoders
            self.encoder, _ = load_encoder(enc.encoder, dict(enc.encoder_kwargs), enc.weights)
            self.encoder.eval().requires_grad_(False)

    def params(self) -> dict[str, Any]:
        fn = getattr(self.dataset, "params", None)
        return dict(fn()) if callable(fn) else {}

    def step(self, batch: dict[str, Any]) -> torch.Tensor:
        """One AdamW step (on a worker thread): the first half of the latent frames given, the
        rest and every action predicted; then the checkpoint of this step, when one is due."""
        run, train = self.run, self.run.request.config.train
        if run.stop.is_set():
            raise _Stopped("stopped by request")
        if self.threads is not None and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        start = time.perf_counter()
        step = run.step + 1
        latents = batch["latents"].to(self.device, torch.float32)
        actions = batch["actions"].to(self.device, torch.float32)
        valid = batch["action_valid"].to(self.device, torch.bool)
        b, frames, steps = latents.shape[0], latents.shape[2], actions.shape[1]
        given = torch.zeros((b, frames), dtype=torch.bool, device=self.device)
        given[:, : frames // 2] = True
        flow = FlowBatch(
            latents, given, ~given, actions, valid,
            torch.zeros((b, steps), dtype=torch.bool, device=self.device),
            torch.ones((b, steps), dtype=torch.bool, device=self.device),
        )  # fmt: skip
        noise_lat, noise_act, t = [], [], []
        for index in torch.as_tensor(batch["index"]).reshape(-1).tolist():
            gen = torch.Generator().manual_seed(sample_seed(train.seed, step, int(index)))
            noise_lat.append(torch.randn(latents.shape[1:], generator=gen))
            noise_act.append(torch.randn(actions.shape[1:], generator=gen))
            t.append(torch.rand((), generator=gen))
        noise = (torch.stack(noise_lat).to(self.device), torch.stack(noise_act).to(self.device))
        self.optimizer.zero_grad(set_to_none=True)
        try:
            loss = self.loss_of(flow, noise, torch.stack(t).to(self.device))
        except ValueError as exc:  # FlowBatch.check: latents that do not fit the world model
            raise ConfigError(
                f"{exc} (check [model] latent_channels / patch_size / max_patches against the "
                "encoder and train.size, train.clip_frames)"
            ) from None
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        value = float(loss.detach())
        run.step = step
        run.losses.append(value)
        run.recent.append(value)
        run.timings.train_s += time.perf_counter() - start
        run.timings.steps += 1
        run.timings.samples += b
        run.timings.wall_s = time.perf_counter() - run.started_at
        self._checkpoint(step)
        if step % LOG_EVERY == 0 or step == train.steps:
            log.info("train step", rank=run.request.rank, step=step, steps=train.steps, loss=value,
                     samples_per_s=round(run.timings.samples_per_s, 3))  # fmt: skip
        return loss.detach()

    def checkpoint_stopped(self) -> int | None:
        """A checkpoint of the last step trained when a stop ends the run between periodic ones
        (a stopped run resumes where it stopped); the step saved, None when there was nothing new."""
        self.checkpointer.wait()  # a periodic save of this very step may be in flight
        step = self.run.step
        if step <= self.run.start_step or step in self.checkpointer.committed:
            return None
        progress = {"sampler": self.sampler.state_at(step - self.run.start_step)}
        self.checkpointer.save(step, self.model, self.optimizer, self.scheduler, progress)
        self.checkpointer.wait()
        return step

    def _checkpoint(self, step: int) -> None:
        train = self.run.request.config.train
        progress = {"sampler": self.sampler.state_at(step - self.run.start_step)}
        if step == train.steps:  # the final step always checkpoints, and the run waits for it
            self.checkpointer.save(step, self.model, self.optimizer, self.scheduler, progress)
            self.checkpointer.wait()
        elif train.checkpoint_every and not self.checkpointer.maybe_save(
            step, self.model, self.optimizer, self.scheduler, progress
        ):
            return
        if self.run.request.rank == 0:
            self._prune(train.keep_checkpoints, step)

    def _prune(self, keep: int, newest: int) -> None:
        """Remove committed checkpoints older than the ``keep`` newest (the one being written counts)."""
        root = Path(self.directory)
        older = sorted(
            step
            for p in root.glob("step-*")
            if p.name[5:].isdigit() and (p / COMMITTED).is_file() and (step := int(p.name[5:])) < newest
        )
        for step in older[: max(0, len(older) - (keep - 1))]:
            shutil.rmtree(checkpoint_path(root, step), ignore_errors=True)

    def close(self) -> None:
        """Wait for a checkpoint in flight (it completes, or its error is dropped: the run ends)."""
        try:
            self.checkpointer.wait()
        except RuntimeError as exc:
            log.warning("checkpoint left uncommitted", error=str(exc))


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
        run.resumed_from = _committed_step(request.config.train.checkpoint_dir)
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
            "checkpoint": _committed_step(run.request.config.train.checkpoint_dir),
            "error": run.error,
        }
        if run.state == "done" and run.final is not None:
            reply["result"] = run.final
        return reply

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
        session: _Session | None = None
        joined = False
        try:
            with anyio.CancelScope() as scope:
                run.scope = scope
                if run.request.config.trainers.threads is None and self.threads is not None:
                    run.request = _with_threads(run.request, self.threads)
                if run.request.world_size > 1:
                    await self._join(run.request)
                    joined = True
                session = await anyio.to_thread.run_sync(_Session, run)
                run.state = "running"
                run.result = await self._train(run, session)
                run.final = {
                    "losses": list(run.losses),
                    "final_checkpoint": str(checkpoint_path(session.directory, run.step)),
                    "weights_sha256": weights_sha256(session.model),
                }
                run.state = "done"
                log.info("train done", rank=run.request.rank, step=run.step, loss=run.losses[-1:] or None)
            if run.state != "done":  # cancelled by stop
                run.state, run.error = "failed", "stopped"
        except Exception as exc:  # reported by progress; the driver decides about a restart
            run.state = "failed"
            run.error = "stopped" if isinstance(exc, _Stopped) else f"{type(exc).__name__}: {exc}"
            log.warning("train failed", rank=run.request.rank, step=run.step, error=run.error)
        finally:
            try:
                with anyio.CancelScope(shield=True):
                    # One rank only: with several, a checkpoint is a collective every rank must join
                    # at the same step, and a stop reaches them between different steps.
                    if session is not None and run.error == "stopped" and run.request.world_size == 1:
                        try:
                            saved = await anyio.to_thread.run_sync(session.checkpoint_stopped)
                            log.info("train stopped", rank=run.request.rank, step=run.step, checkpoint=saved)
                        except Exception as exc:
                            log.warning("stop checkpoint failed", rank=run.request.rank, error=repr(exc))
                    if session is not None:
                        await anyio.to_thread.run_sync(session.close)
                    if joined:
                        await anyio.to_thread.run_sync(close_ranks)
            finally:
                run.ended.set()

    async def _join(self, request: StartRequest) -> None:
        """Join the ranks' process group, rank 0 publishing where through the directory."""
        controls = self.runtime.control_handlers
        cells = getattr(self.runtime, "cells", {})
        if request.rank == 0 and (request.rendezvous in cells or "spawn" in controls):
            rdv = Rendezvous(request.host, _free_port(request.host), 0, request.world_size)
            where = {"addr": rdv.addr, "port": rdv.port, "world_size": rdv.world_size}
            if request.rendezvous in cells:  # published for an earlier run of this process
                cells[request.rendezvous].actor.where = where
            else:
                # A worker's own spawn control, so the node names the actor in its directory and
                # the other ranks' processes find it (runtime.spawn alone stays process-local).
                spec = {"name": request.rendezvous, "class": RENDEZVOUS_CLASS, "kwargs": where}
                await controls["spawn"](spec)
        else:
            rdv = await rendezvous_from(
                self.runtime, request.rendezvous, request.rank, request.world_size, host=request.host
            )
        await anyio.to_thread.run_sync(init_ranks, rdv)

    async def _train(self, run: RankRun, session: _Session) -> TrainResult:
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
