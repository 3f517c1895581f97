"""The encoder's GPU switches for ``troupe bench train``: EncoderActor's samples/s with every
switch off and with each one on alone, where CUDA is present.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from statistics import median

import torch

from troupe.actors.training.inflight import split_groups

from .train_workload import TrainBench, make_batches

__all__ = ["GPU_SWITCHES", "gpu_switches", "measure_switches"]


GPU_SWITCHES = ("compile", "cudnn_benchmark", "bf16")
"""EncoderActor's GPU switches, each measured on its own against all of them off."""


def measure_switches(
    bench: TrainBench, device: str = "cuda", rounds: int = 3
) -> tuple[dict[str, float | None], dict[str, str]]:
    """Encoder samples/s of ``EncoderActor.encode_frames`` (the actor's own path, cache aside) on
    ``device``: ``baseline`` with every switch off, then each switch on alone; the median of
    ``rounds`` passes over the run's groups, after warm-up passes (compiling, autotuning).

    Returns the figures and, for a switch that failed (torch.compile without a compiler, say),
    its error; that figure is None and the others are still taken. On a CPU device the actor turns
    the switches off, so every figure measures the same path.
    """
    from troupe.actors.encoders.encoder_actor import EncoderActor

    batches = make_batches(bench, 4)
    groups = [g.video for i, b in enumerate(batches) for g in split_groups(i, b["video"], bench.group_size)]
    figures: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    for name in ("baseline", *GPU_SWITCHES):
        torch.backends.cudnn.benchmark = False  # a global flag: a switch measured before keeps it
        try:
            actor = EncoderActor(encoder_kwargs=bench.vae_kwargs(), device=device, memory_mb=0, disk_mb=0,
                                 compile=name == "compile", cudnn_benchmark=name == "cudnn_benchmark",
                                 bf16=name == "bf16")  # fmt: skip
            try:
                for _ in range(2):
                    for video in groups:
                        actor.encode_frames(video)  # .cpu() inside waits for the device
                rates = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    for video in groups:
                        actor.encode_frames(video)
                    rates.append(sum(int(v.shape[0]) for v in groups) / (time.perf_counter() - start))
                figures[name] = median(rates)
            finally:
                actor.cache.close()
        except Exception as exc:  # one switch's failure is its figure, not the bench's end
            figures[name] = None
            errors[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    torch.backends.cudnn.benchmark = False
    return figures, errors


def gpu_switches(bench: TrainBench, say: Callable[[str], None]) -> tuple[dict[str, float | None] | None, str]:
    """The switches' figures where CUDA is present, else None; and what to know about them."""
    if not torch.cuda.is_available():
        return None, "no CUDA device: the GPU switches apply on a GPU only (on CPU they are off)"
    say("measuring the encoder's GPU switches")
    figures, errors = measure_switches(bench, "cuda")
    failed = "; ".join(f"{name} failed: {error}" for name, error in errors.items())
    return figures, f"measured on {torch.cuda.get_device_name()}" + (f"; {failed}" if failed else "")
