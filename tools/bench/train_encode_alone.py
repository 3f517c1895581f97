"""Encoding alone for ``troupe bench train``: processes encoding the run's groups as the encoder
actors would, without messaging, each its share, round by round (half of its bound).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict

import psutil
import torch

from troupe.actors.encoders.encoder_actor import video_vae_encoder
from troupe.actors.training.inflight import encode_video, split_groups

from .train_workload import WARMUP_STEPS, TrainBench, cpu_s, make_batches, sample_count

__all__ = ["EncodeAlone", "encode_share"]


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
        self.samples = sample_count(make_batches(bench, steps))
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
        cpu = cpu_s(watched)
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        seconds = [float(self._line(proc, "figure")) for proc in self.procs]
        self.cpu_ms_per_sample = 1000 * (cpu_s(watched) - cpu) / self.samples
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
