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
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from statistics import median
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
    split_groups,
    train_local,
    train_remote,
)
from troupe.models.world_model import ACTION_DIM, FlowBatch, WorldModel, WorldModelConfig
from troupe.runtime.core.client import connect
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.config import ActorSpec, NodeConfig, WorkerSpec
from troupe.runtime.node.local import start_local_node
from troupe.runtime.transports.loopback import free_endpoint

from .pipeline import usable_cores
from .stopping import bench_folder

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


def _samples(batches: Sequence[dict[str, Any]]) -> int:
    return sum(int(b["video"].shape[0]) for b in batches)


def _cpu_s(procs: Sequence[psutil.Process]) -> float:
    """CPU seconds (user and system, every thread) the processes have used; a gone one counts 0."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def encode_share(bench: TrainBench, steps: int, actors: int, share: int, threads: int) -> None:
    """Encoding alone, as encoder actor ``share`` of ``actors`` would (round-robin over the
    groups): warm up and print "ready"; then for each line on stdin, encode and print the seconds."""
    torch.set_num_threads(threads)
    encoder = video_vae_encoder(**bench.vae_kwargs())
    batches = make_batches(bench, steps + WARMUP_STEPS)
    groups = [
        g for i, b in enumerate(batches[WARMUP_STEPS:]) for g in split_groups(i, b["video"], bench.group_size)
    ]
    mine = groups[share::actors]
    encode_video(encoder, batches[0]["video"][: bench.group_size])
    print("ready", flush=True)
    for _ in sys.stdin:
        start = time.perf_counter()
        for group in mine:
            encode_video(encoder, group.video)
        print(json.dumps(time.perf_counter() - start), flush=True)


class EncodeAlone:
    """``actors`` processes encoding the run's groups together, as the encoder actors would
    without messaging: :meth:`measure` is one round; :meth:`close` ends and reaps them."""

    CODE = (
        "import json, sys; from troupe.cli.bench.train import TrainBench, encode_share; "
        "a = json.loads(sys.argv[1]); encode_share(TrainBench(**a.pop('bench')), **a)"
    )

    def __init__(self, bench: TrainBench, steps: int, actors: int, threads: int) -> None:
        self.samples = _samples(make_batches(bench, steps))
        self.cpu_ms_per_sample = 0.0
        self.procs: list[subprocess.Popen[str]] = []
        # Not through bench_children: this runs on a worker thread, whose end would SIGTERM them
        # mid-run. They end with the benchmark anyway: its death closes their stdin, and a
        # process whose input has ended returns (encode_share) once its round is done.
        try:
            for share in range(actors):
                arg = {"bench": asdict(bench), "steps": steps, "actors": actors, "share": share,
                       "threads": threads}  # fmt: skip
                self.procs.append(
                    subprocess.Popen([sys.executable, "-c", self.CODE, json.dumps(arg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)  # Ctrl-C is the bench's, not theirs
                )  # fmt: skip
            for proc in self.procs:
                if (line := self._line(proc, "start")) != "ready":
                    raise RuntimeError(f"encoding-alone process {proc.pid} said {line!r}, not 'ready'")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _line(proc: subprocess.Popen[str], what: str) -> str:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"encoding-alone process {proc.pid} exited before its {what}")
        return line

    def measure(self) -> float:
        """Samples/s of one round: every process starts at once; the slowest sets the time.
        ``cpu_ms_per_sample`` is what the round cost the processes together."""
        watched = [psutil.Process(proc.pid) for proc in self.procs]
        cpu = _cpu_s(watched)
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        seconds = [float(self._line(proc, "figure")) for proc in self.procs]
        self.cpu_ms_per_sample = 1000 * (_cpu_s(watched) - cpu) / self.samples
        return self.samples / max(seconds)

    def close(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()  # end of input: the process returns
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


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
    cpu, start = _cpu_s(me), time.perf_counter()
    for batch in with_latents[WARMUP_STEPS:]:
        step(batch)
    seconds, cpu = time.perf_counter() - start, _cpu_s(me) - cpu
    samples = _samples(with_latents[WARMUP_STEPS:])
    return samples / seconds, 1000 * cpu / samples


def _local(bench: TrainBench, batches: list[dict[str, Any]], threads: int) -> tuple[float, list[float]]:
    torch.set_num_threads(threads)
    encoder = video_vae_encoder(**bench.vae_kwargs())
    step = make_train_step(bench.world_model(), threads)
    config = InflightConfig(group_size=bench.group_size)
    train_local(batches[:WARMUP_STEPS], step, encoder, config)
    result = train_local(batches[WARMUP_STEPS:], step, encoder, config)
    return result.timings.samples_per_s, result.losses


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


def _gpu_switches(
    bench: TrainBench, say: Callable[[str], None]
) -> tuple[dict[str, float | None] | None, str]:
    """The switches' figures where CUDA is present, else None; and what to know about them."""
    if not torch.cuda.is_available():
        return None, "no CUDA device: the GPU switches apply on a GPU only (on CPU they are off)"
    say("measuring the encoder's GPU switches")
    figures, errors = measure_switches(bench, "cuda")
    failed = "; ".join(f"{name} failed: {error}" for name, error in errors.items())
    return figures, f"measured on {torch.cuda.get_device_name()}" + (f"; {failed}" if failed else "")


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
    cpu_me, cpu_workers = _cpu_s([me]), _cpu_s(workers)
    result = await train_remote(batches[WARMUP_STEPS:], step, encode, actors, config)
    samples = max(1, result.timings.samples)
    out.cpu.setdefault(f"remote_trainer-{k}", []).append(1000 * (_cpu_s([me]) - cpu_me) / samples)
    out.cpu.setdefault(f"remote_encoders-{k}", []).append(1000 * (_cpu_s(workers) - cpu_workers) / samples)
    return result


async def _rounds(
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
            rounds = anyio.run(_rounds, bench, batches, actors, threads, depths, repeat, Path(tmp), say,
                               backend_options={"use_uvloop": True})  # fmt: skip
        torch.set_num_threads(initial_threads)
        switches, switches_note = _gpu_switches(bench, say)
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
