"""One trainer rank's training objects and its train step: the world model, optimizer, LR
schedule, data, sampler and checkpointer of one run (:class:`RankSession`, built on a worker
thread), and what makes the steps reproducible (:func:`lr_lambda`, :func:`sample_seed`,
:func:`weights_sha256`)."""

from __future__ import annotations

import hashlib
import importlib
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from troupe.actors.encoders.encoder_actor import load_encoder
from troupe.models.world_model import FlowBatch, WorldModel
from troupe.runtime import ConfigError
from troupe.runtime.library_logging import get_logger

from .checkpoint import COMMITTED, Checkpointer, checkpoint_path, latest, load
from .dataset import clip_batches
from .lr_plan import extended, plan_factor, plan_line, read_plan
from .rank_run import RankRun
from .sampler import ResumableSampler
from .train_config import TrainConfig

__all__ = [
    "LossNotFinite",
    "RankSession",
    "ResumeMismatch",
    "Stopped",
    "lr_lambda",
    "sample_seed",
    "weights_sha256",
]

log = get_logger(__name__)


class Stopped(Exception):
    """The run was stopped by request (raised in the train step, after the step before)."""


def lr_lambda(config: TrainConfig, plan: list[list[int]] | None = None) -> Any:
    """The LR factor of step ``s``: linear warmup, then cosine to 0 at ``steps`` (or constant);
    under ``plan``, the training's schedule across its runs (:mod:`.lr_plan`)."""
    train = config.train
    return plan_factor(plan or [[0, train.steps]], train.warmup_steps, train.schedule == "cosine")


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


def _import(path: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"train.dataset_class: cannot import {path!r}: {exc}") from exc
    return obj


class LossNotFinite(ValueError):
    """The loss of a step is nan or infinite: training diverged (a learning rate too high, or
    bad data). Every rank restarted from the last checkpoint would diverge again: the run ends
    (``final`` in the rank's progress)."""


class ResumeMismatch(ValueError):
    """The checkpoint's sampler position cannot go on over this run's data: another
    ``train.seed``, or a dataset with fewer clips than the checkpoint was trained on (its
    position is over clips that are not there). Every restart would resume it again: the run
    ends (``final`` in the rank's progress)."""


def _check_resumable(state: Any, dataset: Any, seed: int, checkpoint: Path, step: int) -> None:
    """ResumeMismatch where the sampler ``state`` restored from ``checkpoint`` (of ``step``)
    cannot go on with ``seed`` over ``dataset``: checked before anything trains (a dataset that
    shrank failed each restart on ``IndexError: clip index 21 out of range``)."""
    if not isinstance(state, dict):
        return  # a global position alone (an older checkpoint): resumed as far as it goes
    if int(state.get("seed", seed)) != seed:
        raise ResumeMismatch(
            f"the checkpoint at step {step} ({checkpoint}) was trained with train.seed="
            f"{state['seed']}, this run asks train.seed={seed}: give back train.seed = "
            f"{state['seed']}, or --fresh to start anew"
        )
    clips, trained = len(dataset), int(state.get("epoch_size", 0))
    if trained > clips:
        root = getattr(dataset, "root", "train.dataset")
        raise ResumeMismatch(
            f"the dataset at {root} has {clips} clips, the checkpoint at step {step} ({checkpoint}) "
            f"was trained on {trained}: it changed since; give the run back the dataset it trained "
            "on, or --fresh to start anew on this one"
        )


def _agreed_loss(loss: torch.Tensor, rank: int, world_size: int) -> tuple[float, str]:
    """The step's loss every rank records and checks (with several ranks the mean of theirs, by
    one all-reduce), and what the error of a loss that is not finite says of the ranks.

    Every rank takes this same value before ``backward``, so a loss that is not finite on one
    rank stops them all at the same step: a rank that stopped alone left the others waiting in
    ``backward``'s gradient all-reduce. The plain mean is the global batch's loss as DDP trains
    on it (the gradients are averaged over ranks) and every rank's batch has the same size (the
    sampler gives each rank ``batch_size`` clips every step). One rank: no collective at all.
    """
    if world_size == 1:
        return float(loss.detach()), ""
    # [the loss, one flag per rank]: a nan on one rank makes the sum nan, the flags say whose.
    # On the loss's device: a CPU tensor goes through gloo, a CUDA one through nccl.
    parts = torch.zeros(1 + world_size, dtype=torch.float64, device=loss.device)
    parts[0] = loss.detach()
    parts[1 + rank] = (~torch.isfinite(parts[0])).to(torch.float64)
    dist.all_reduce(parts)
    totals = parts.tolist()
    value = totals[0] / world_size
    bad = [r for r in range(world_size) if totals[1 + r] > 0]
    on = f"rank {bad[0]}" if len(bad) == 1 else f"ranks {', '.join(map(str, bad))}"
    where = f"not finite on {on} of {world_size}; " if bad else f"the mean over {world_size} ranks; "
    return value, where


class _LossOf(nn.Module):
    """The world model's loss as a forward, so DDP's gradient hooks see it."""

    def __init__(self, model: WorldModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: FlowBatch, noise: tuple[torch.Tensor, torch.Tensor], t: torch.Tensor) -> Any:
        return self.model.loss(batch, noise=noise, t=t).loss


class RankSession:
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
        # The training's schedule: this run's steps until a checkpoint says otherwise (below).
        self.plan = extended(None, train.steps)
        # A function, not the bound method: LambdaLR keeps the state of any other callable.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: self._factor(s))
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
            self.plan = extended(read_plan(restored.progress.get("schedule")), train.steps)
            run.note = plan_line(
                self.plan, run.start_step, train.steps, train.warmup_steps, train.schedule == "cosine"
            )
            self._rate_of_plan()
        dataset_cls = _import(train.dataset_class)
        self.dataset = dataset_cls(
            train.dataset,
            clip_frames=train.clip_frames,
            action_steps=train.action_steps,
            size=tuple(train.size) if train.size is not None else None,
            stride=train.stride,
            min_episodes=train.min_episodes,
        )
        if found is not None:
            _check_resumable(sampler_state, self.dataset, train.seed, found, run.start_step)
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

    def _factor(self, s: int) -> float:
        """The LR factor of scheduler step ``s`` under the training's plan (read as it is now)."""
        train = self.run.request.config.train
        return float(plan_factor(self.plan, train.warmup_steps, train.schedule == "cosine")(s))

    def _rate_of_plan(self) -> None:
        """The learning rate of the next step as the plan gives it: the optimizer restored holds
        the one the run before computed, under its plan (an extension's first step had trained
        at the 0 the plan before annealed to)."""
        step = self.scheduler.last_epoch
        rates = [base * self._factor(step) for base in self.scheduler.base_lrs]
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate

    def params(self) -> dict[str, Any]:
        fn = getattr(self.dataset, "params", None)
        return dict(fn()) if callable(fn) else {}

    def step(self, batch: dict[str, Any]) -> torch.Tensor:
        """One AdamW step (on a worker thread): the first half of the latent frames given, the
        rest and every action predicted; then the checkpoint of this step, when one is due."""
        run, train = self.run, self.run.request.config.train
        if run.stop.is_set():
            raise Stopped("stopped by request")
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
        value, where = _agreed_loss(loss, run.request.rank, run.request.world_size)
        if not math.isfinite(value):  # checked before the step changes the model: nothing is lost
            raise LossNotFinite(
                f"step {step}: the loss is {value} ({where}train.lr = {train.lr:g}); the run stops "
                "before this step changes the model, and the checkpoints of the steps before it "
                "stay: lower train.lr (or look at the data) and run again"
            )
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        run.step = step
        run.losses.append(value)
        run.recent.append(value)
        run.timings.train_s += time.perf_counter() - start
        run.timings.steps += 1
        run.timings.samples += b
        run.timings.wall_s = time.perf_counter() - run.started_at
        self._checkpoint(step)  # the run's log has the steps: the driver's train_progress
        return torch.tensor(value, dtype=torch.float64)

    def checkpoint_stopped(self) -> int | None:
        """A checkpoint of the last step trained when a stop ends the run between periodic ones
        (a stopped run resumes where it stopped); the step saved, None when there was nothing new."""
        self.checkpointer.wait()  # a periodic save of this very step may be in flight
        step = self.run.step
        if step <= self.run.start_step or step in self.checkpointer.committed:
            return None
        progress = {"sampler": self.sampler.state_at(step - self.run.start_step), "schedule": self.plan}
        self.checkpointer.save(step, self.model, self.optimizer, self.scheduler, progress)
        self.checkpointer.wait()
        return step

    def _checkpoint(self, step: int) -> None:
        train = self.run.request.config.train
        progress = {"sampler": self.sampler.state_at(step - self.run.start_step), "schedule": self.plan}
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
            log.warning("train_checkpoint_left_uncommitted", error=str(exc))
