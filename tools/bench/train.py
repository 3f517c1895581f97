"""``troupe bench train``: training with encoding inside the trainer against encoder actors.

In one run, on this machine's cores, the same steps of the world model (troupe.models) on
latents of troupe's video VAE (frozen), over seeded synthetic batches (uint8 video, 59-dim
actions and their validity mask):

- ``local_samples_per_s``: :func:`~troupe.actors.training.inflight.train_local`, the trainer
  encoding each batch itself before its step;
- ``remote_samples_per_s``: :func:`~troupe.actors.training.inflight.train_remote`, the groups
  encoded by ``actors`` EncoderActor worker processes of a local node, at most K batches in
  flight (the best of the K tried, each K's figure beside it);
- ``bound_samples_per_s``: the slower of encoding alone (the same groups, in ``actors`` fresh
  processes with the encoder actors' threads, started together) and training alone (the same
  steps on precomputed latents with the trainer's threads): what perfect hiding of one behind
  the other would reach.

Threads: the cores are split between the two sides, as a deployment splits its hosts. The
trainer (this process) gets ``cores // 2`` torch threads (at least 1), the encoder actors share
the rest, ``(cores - trainer) // actors`` each (at least 1), so that on 2 cores the trainer and
one encoder each own one core and neither steals from the other. The local baseline runs with
the trainer's threads and with every core, and the faster counts (on a busy 2-core machine two
torch threads can be slower than one), so the comparison favours it, if anything. Each mode starts
from the same initial weights; the encoder actors' cache is off (a benchmark that hit it would
measure the cache, not the overlap), and every measured run follows unmeasured warm-up steps.

Where CUDA is present, ``gpu_switches`` adds the encoder's samples/s on the GPU with all of
EncoderActor's GPU switches off (``baseline``) and with each one on alone (``compile``,
``cudnn_benchmark``, ``bf16``), through the actor's own encode path (:func:`measure_switches`);
elsewhere it is null and ``gpu_switches_note`` says why.

The pipeline's fill (the first batch waits for its latents with nothing to overlap) is a fixed
cost of a run, about one step's encoding; the measured runs are long enough (64 steps by
default) that it weighs little against the steady state the bound describes.

Groups: each batch of 8 goes out in groups of ``group_size`` samples (4 by default, ``--group-size``):
every group is one ask and one reply, with its wake-ups on both sides, so two asks per step
rather than four halve what messaging costs the trainer and the encoders per sample.

``cpu_ms_per_sample`` explains the figure where rates are noisy (a shared machine): the CPU time
per sample of the trainer process and of the encoder actors' processes in the best K's remote run,
beside that of training and encoding alone, and of each beside the other with nothing passed
between them (``*_together``); remote minus together is what troupe's messaging costs each side.

Every figure is taken ``repeat`` times, in turn (local, encoding alone, training alone, remote
at each K, then again), and the medians are reported, so a slow spell of a shared machine falls
on all of them. The node runs in this process (as ``troupe run`` does); the encoding-alone
processes stay up between rounds, idle while the other figures are taken.

The parts: :mod:`.train_workload` (the sizes, batches, train step and thread split),
:mod:`.train_encode_alone` (the encoding-alone processes), :mod:`.train_rounds` (every figure
``repeat`` times) and :mod:`.train_gpu_switches`; this module checks the arguments, runs the
rounds and reports the medians.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any

import anyio
import torch

from troupe.runtime.logs import configure_logging

from .pipeline import usable_cores
from .stopping import bench_folder
from .train_encode_alone import EncodeAlone, encode_share
from .train_gpu_switches import GPU_SWITCHES, gpu_switches, measure_switches
from .train_rounds import measure_rounds
from .train_workload import WARMUP_STEPS, TrainBench, make_batches, make_train_step, split_threads

__all__ = [
    "DEFAULT_INFLIGHT",
    "GPU_SWITCHES",
    "EncodeAlone",
    "TrainBench",
    "encode_share",
    "make_batches",
    "make_train_step",
    "measure_switches",
    "measure_train",
    "split_threads",
]

DEFAULT_INFLIGHT = (1, 2, 4, 8)
"""In-flight depths tried when none is given."""


def measure_train(
    steps: int = 64,
    inflight: int | None = None,
    actors: int | None = None,
    progress: Callable[[str], None] | None = None,
    bench: TrainBench | None = None,
    repeat: int = 3,
    group_size: int | None = None,
) -> dict[str, Any]:
    """Run the local, remote and alone measurements ``repeat`` times; return every figure
    (medians; see the module). ``group_size``: samples per group, else ``bench``'s."""
    say = progress or (lambda _m: None)
    bench = bench or TrainBench()
    checked = (("steps", steps), ("repeat", repeat), ("inflight", inflight), ("actors", actors),
               ("group_size", group_size))  # fmt: skip
    for name, value in checked:
        if value is not None and value < 1:
            raise ValueError(f"{name}={value!r}: expected at least 1")
    if group_size is not None:
        bench = replace(bench, group_size=group_size)
    cores = usable_cores()
    # One actor per core the trainer leaves free, by default.
    actors = actors if actors is not None else max(1, cores - split_threads(cores, 1)[0])
    depths = (inflight,) if inflight is not None else DEFAULT_INFLIGHT
    threads = split_threads(cores, actors)
    configure_logging("bench", "bench", None, console=False, level="warning")  # stdout stays JSON
    batches = make_batches(bench, steps + WARMUP_STEPS)
    initial_threads = torch.get_num_threads()
    try:
        with bench_folder("troupe-bench-train-") as tmp:
            # uvloop, as in the worker processes: the trainer's event loop takes less of its core.
            rounds = anyio.run(measure_rounds, bench, batches, actors, threads, depths, repeat, Path(tmp),
                               say, backend_options={"use_uvloop": True})  # fmt: skip
        torch.set_num_threads(initial_threads)
        switches, switches_note = gpu_switches(bench, say)
    finally:
        torch.set_num_threads(initial_threads)
    local_by = {n: median(v) for n, v in rounds.local.items()}
    remote_by = {k: median(v) for k, v in rounds.remote.items()}
    local_threads = max(local_by, key=lambda n: local_by[n])
    best = max(remote_by, key=lambda k: remote_by[k])
    encode_rate, train_rate = median(rounds.encode), median(rounds.train)
    bound = min(encode_rate, train_rate)
    together = median(min(pair) for pair in rounds.together)
    reference = rounds.losses[f"local-{local_threads}"]
    return {
        "local_samples_per_s": local_by[local_threads],
        "remote_samples_per_s": remote_by[best],
        "bound_samples_per_s": bound,
        "remote_vs_bound": remote_by[best] / bound,
        "inflight": best,
        "remote_vs_local": remote_by[best] / local_by[local_threads],
        "encode_alone_samples_per_s": encode_rate,
        "train_alone_samples_per_s": train_rate,
        # Both sides at once without messaging: the share of the gap the cores themselves cost.
        "together_bound_samples_per_s": together,
        "remote_vs_together_bound": remote_by[best] / together,
        "remote_samples_per_s_by_inflight": {str(k): rate for k, rate in remote_by.items()},
        # CPU time per sample (medians), steadier than rates on a busy machine: remote minus
        # together (both sides at once, nothing passed), per side, is what the messaging costs
        # the trainer and the encoders; together minus alone, what the sides cost each other.
        "cpu_ms_per_sample": {
            "encode_alone": median(rounds.cpu["encode_alone"]),
            "train_alone": median(rounds.cpu["train_alone"]),
            "encode_together": median(rounds.cpu["encode_together"]),
            "train_together": median(rounds.cpu["train_together"]),
            "remote_trainer": median(rounds.cpu[f"remote_trainer-{best}"]),
            "remote_encoders": median(rounds.cpu[f"remote_encoders-{best}"]),
        },
        # Where the best K's median run spent its time: with encoding hidden, wait_s stays small.
        "remote_stages": sorted(rounds.stages[best], key=lambda st: st["samples_per_s"])[repeat // 2],
        "local_samples_per_s_by_threads": {str(n): rate for n, rate in local_by.items()},
        "gpu_switches": switches,
        "gpu_switches_note": switches_note,
        "max_loss_diff": max(
            abs(a - b) for losses in rounds.losses.values() for a, b in zip(reference, losses, strict=True)
        ),
        "steps": steps,
        "repeat": repeat,
        "batch_size": bench.batch_size,
        "group_size": bench.group_size,
        "actors": actors,
        "local_threads": local_threads,
        "trainer_threads": threads[0],
        "encoder_threads": threads[1],
        "cores": cores,
    }
