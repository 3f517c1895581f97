"""The rounds of ``troupe bench train``: every figure taken in turn (training with local
encoding, encoding alone, training alone, both alone at once, and remote runs against encoder
actors of a node in this process at each in-flight depth), ``repeat`` times, with the CPU time
each cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import psutil
import torch

from troupe.actors.encoders.encoder_actor import video_vae_encoder
from troupe.actors.training.inflight import (
    InflightConfig,
    TrainResult,
    actor_encoder,
    encode_video,
    train_local,
    train_remote,
)
from troupe.runtime.core.client import connect
from troupe.runtime.node.config import ActorSpec, NodeConfig, WorkerSpec
from troupe.runtime.node.local import start_local_node
from troupe.runtime.transports.loopback import free_endpoint

from .pipeline import usable_cores
from .train_encode_alone import EncodeAlone
from .train_workload import WARMUP_STEPS, TrainBench, cpu_s, make_train_step, sample_count

__all__ = ["measure_rounds"]


def _with_latents(bench: TrainBench, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    encoder = video_vae_encoder(**bench.vae_kwargs())
    return [{**b, "latents": encode_video(encoder, b["video"])} for b in batches]


def _train_alone(bench: TrainBench, with_latents: list[dict[str, Any]], threads: int) -> tuple[float, float]:
    """Samples/s of the train steps alone, on latents computed beforehand, and the CPU ms per
    sample this process spent meanwhile."""
    torch.set_num_threads(threads)
    step = make_train_step(bench.world_model(), threads)
    for batch in with_latents[:WARMUP_STEPS]:
        step(batch)
    me = [psutil.Process()]
    cpu, start = cpu_s(me), time.perf_counter()
    for batch in with_latents[WARMUP_STEPS:]:
        step(batch)
    seconds, cpu = time.perf_counter() - start, cpu_s(me) - cpu
    samples = sample_count(with_latents[WARMUP_STEPS:])
    return samples / seconds, 1000 * cpu / samples


def _local(bench: TrainBench, batches: list[dict[str, Any]], threads: int) -> tuple[float, list[float]]:
    torch.set_num_threads(threads)
    encoder = video_vae_encoder(**bench.vae_kwargs())
    step = make_train_step(bench.world_model(), threads)
    config = InflightConfig(group_size=bench.group_size)
    train_local(batches[:WARMUP_STEPS], step, encoder, config)
    result = train_local(batches[WARMUP_STEPS:], step, encoder, config)
    return result.timings.samples_per_s, result.losses


def _node_config(bench: TrainBench, actors: int, threads: int, log_dir: Path) -> NodeConfig:
    kwargs = {"encoder_kwargs": bench.vae_kwargs(), "device": "cpu", "memory_mb": 0, "disk_mb": 0,
              "threads": threads}  # fmt: skip
    workers = tuple(
        WorkerSpec(
            name=f"w-encode-{i}",
            actors=(
                ActorSpec(
                    name=f"encode-{i}", cls="troupe.actors.encoders.encoder_actor:EncoderActor", kwargs=kwargs
                ),
            ),
        )
        for i in range(actors)
    )
    return NodeConfig(name="bench-train", endpoint=free_endpoint(), log_dir=log_dir, log_level="warning",
                      workers=workers)  # fmt: skip


@dataclass
class _Rounds:
    """Each round's figures, medians taken at the end; losses of the first round."""

    local: dict[int, list[float]]
    remote: dict[int, list[float]]
    encode: list[float]
    train: list[float]
    losses: dict[str, list[float]]
    stages: dict[int, list[dict[str, float]]]
    """Each remote run's stage timings (read, wait for latents, train step), by K."""
    together: list[tuple[float, float]] = field(default_factory=list)
    """Encoding alone and training alone run at the same time: (encode, train) samples/s."""
    cpu: dict[str, list[float]] = field(default_factory=dict)
    """CPU ms per sample, each round's: ``encode_alone``, ``train_alone``, ``encode_together``,
    ``train_together``, and ``remote_trainer`` / ``remote_encoders`` by K (``remote_trainer-4``...)."""


async def _together(
    alone: EncodeAlone, bench: TrainBench, precomputed: list[dict[str, Any]], threads: int, out: _Rounds
) -> tuple[float, float]:
    """Encoding alone and training alone at the same time, nothing passed between them: what
    the two sides cost each other on shared cores (caches, memory, sibling hyperthreads)
    without any messaging. A diagnostic beside the bound, not the bound. Their CPU ms per
    sample go to ``out.cpu`` (``encode_together``, ``train_together``)."""
    rates: dict[str, float] = {}

    async def encode() -> None:
        rates["encode"] = await anyio.to_thread.run_sync(alone.measure)
        out.cpu.setdefault("encode_together", []).append(alone.cpu_ms_per_sample)

    async def train() -> None:
        rates["train"], cpu = await anyio.to_thread.run_sync(_train_alone, bench, precomputed, threads)
        out.cpu.setdefault("train_together", []).append(cpu)

    async with anyio.create_task_group() as tg:
        tg.start_soon(encode)
        tg.start_soon(train)
    return rates["encode"], rates["train"]


async def _remote(
    bench: TrainBench,
    batches: list[dict[str, Any]],
    encode: Any,
    actors: int,
    threads: int,
    k: int,
    alone: EncodeAlone,
    out: _Rounds,
) -> TrainResult:
    """One remote run at depth ``k`` after warm-up steps, with the CPU time it cost this process
    (the trainer, and the node's idle loop) and the encoder actors' processes."""
    step = make_train_step(bench.world_model(), threads)
    config = InflightConfig(inflight=k, group_size=bench.group_size, deadline_s=120)
    await train_remote(batches[:WARMUP_STEPS], step, encode, actors, config)
    # The node's processes but the encoding-alone ones: the encoder actors (and the node's
    # supervisor and template, idle meanwhile).
    me = psutil.Process()
    others = {proc.pid for proc in alone.procs}
    workers = [proc for proc in me.children(recursive=True) if proc.pid not in others]
    cpu_me, cpu_workers = cpu_s([me]), cpu_s(workers)
    result = await train_remote(batches[WARMUP_STEPS:], step, encode, actors, config)
    samples = max(1, result.timings.samples)
    out.cpu.setdefault(f"remote_trainer-{k}", []).append(1000 * (cpu_s([me]) - cpu_me) / samples)
    out.cpu.setdefault(f"remote_encoders-{k}", []).append(1000 * (cpu_s(workers) - cpu_workers) / samples)
    return result


async def measure_rounds(
    bench: TrainBench,
    batches: list[dict[str, Any]],
    actors: int,
    threads: tuple[int, int],
    depths: Sequence[int],
    repeat: int,
    log_dir: Path,
    say: Callable[[str], None],
) -> _Rounds:
    """Every figure ``repeat`` times, in turn, so a slow spell of a shared machine falls on all
    of them; CPU-bound parts run on a worker thread, so the in-process node goes on answering."""
    cores = usable_cores()
    local_threads = sorted({threads[0], cores})
    out = _Rounds(
        {n: [] for n in local_threads}, {k: [] for k in depths}, [], [], {}, {k: [] for k in depths}
    )
    cfg = _node_config(bench, actors, threads[1], log_dir)
    names = [f"encode-{i}" for i in range(actors)]
    say(f"starting {actors} encoder actors and {actors} encoding-alone processes")
    precomputed = await anyio.to_thread.run_sync(_with_latents, bench, batches)
    alone = await anyio.to_thread.run_sync(
        EncodeAlone, bench, len(batches) - WARMUP_STEPS, actors, threads[1]
    )
    try:
        async with anyio.create_task_group() as tg:
            node = await start_local_node(tg, cfg)
            try:
                async with connect(cfg.endpoint, "bench-train") as rt:
                    encode = actor_encoder(rt, names, timeout=120)
                    for r in range(repeat):
                        say(f"round {r + 1} of {repeat}")
                        for n in local_threads:
                            rate, losses = await anyio.to_thread.run_sync(_local, bench, batches, n)
                            out.local[n].append(rate)
                            out.losses.setdefault(f"local-{n}", losses)
                        out.encode.append(await anyio.to_thread.run_sync(alone.measure))
                        out.cpu.setdefault("encode_alone", []).append(alone.cpu_ms_per_sample)
                        train_alone = partial(_train_alone, bench, precomputed, threads[0])
                        rate, cpu = await anyio.to_thread.run_sync(train_alone)
                        out.train.append(rate)
                        out.cpu.setdefault("train_alone", []).append(cpu)
                        out.together.append(await _together(alone, bench, precomputed, threads[0], out))
                        for k in depths:
                            result = await _remote(bench, batches, encode, actors, threads[0], k, alone, out)
                            out.remote[k].append(result.timings.samples_per_s)
                            out.stages[k].append(result.timings.as_dict())
                            out.losses.setdefault(f"remote-{k}", result.losses)
            finally:
                node.stopping.set()
    finally:
        await anyio.to_thread.run_sync(alone.close)
    return out
