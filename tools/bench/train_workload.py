"""``troupe bench train``'s workload: the sizes (tiny, but the real VAE and world model),
seeded synthetic batches, the world model's train step, how the cores are split between the
trainer and the encoder actors, and the counts every measurement takes (samples, CPU seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from troupe.models.world_model import ACTION_DIM, FlowBatch, WorldModel, WorldModelConfig

__all__ = [
    "SEED",
    "WARMUP_STEPS",
    "TrainBench",
    "cpu_s",
    "make_batches",
    "make_train_step",
    "sample_count",
    "split_threads",
]

WARMUP_STEPS = 2
SEED = 0


@dataclass(frozen=True)
class TrainBench:
    """Sizes of the workload: tiny, but the real VAE and world model."""

    batch_size: int = 8
    frames: int = 8
    side: int = 32
    action_steps: int = 8
    group_size: int = 4
    vae_channels: int = 8
    d_model: int = 96
    layers: int = 3

    def vae_kwargs(self) -> dict[str, Any]:
        return {"base_channels": self.vae_channels, "frames": self.frames, "seed": SEED}

    def world_model(self) -> WorldModel:
        torch.manual_seed(SEED)
        return WorldModel(WorldModelConfig(d_model=self.d_model, layers=self.layers, heads=4))


def make_batches(bench: TrainBench, count: int, seed: int = SEED) -> list[dict[str, Any]]:
    """``count`` seeded batches: uint8 video, actions with their validity mask, and their index."""
    gen = torch.Generator().manual_seed(seed)
    b, t = bench.batch_size, bench.action_steps
    return [
        {
            "video": torch.randint(
                0, 256, (b, 3, bench.frames, bench.side, bench.side), generator=gen, dtype=torch.uint8
            ),
            "actions": torch.randn((b, t, ACTION_DIM), generator=gen),
            "action_valid": torch.rand((b, t, ACTION_DIM), generator=gen) > 0.3,
            "index": i,
        }
        for i in range(count)
    ]


def make_train_step(
    model: WorldModel, threads: int | None = None
) -> Callable[[dict[str, Any]], torch.Tensor]:
    """One AdamW step of the flow-matching loss: the first half of the latent frames is given,
    the rest and every action predicted; noise and flow times seeded by the batch's index.

    ``threads``: torch threads of the step, set in the thread that runs it (``train_remote``
    runs steps on worker threads, where the main thread's setting may not hold)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch: dict[str, Any]) -> torch.Tensor:
        if threads is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        latents = batch["latents"]
        b, frames = latents.shape[0], latents.shape[2]
        given = torch.zeros((b, frames), dtype=torch.bool)
        given[:, : frames // 2] = True
        steps = batch["actions"].shape[1]
        flow = FlowBatch(
            latents,
            given,
            ~given,
            batch["actions"],
            batch["action_valid"],
            torch.zeros((b, steps), dtype=torch.bool),
            torch.ones((b, steps), dtype=torch.bool),
        )
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(flow, generator=torch.Generator().manual_seed(int(batch["index"]))).loss
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def split_threads(cores: int, actors: int) -> tuple[int, int]:
    """``(trainer threads, threads of each encoder actor)`` sharing ``cores`` (see the module)."""
    trainer = max(1, cores // 2)
    return trainer, max(1, (cores - trainer) // actors)


def sample_count(batches: Sequence[dict[str, Any]]) -> int:
    return sum(int(b["video"].shape[0]) for b in batches)


def cpu_s(procs: Sequence[psutil.Process]) -> float:
    """CPU seconds (user and system, every thread) the processes have used; a gone one counts 0."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total
