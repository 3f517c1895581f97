"""``troupe bench train --json``: one JSON object with the figures issue 13 names, every process
it started gone when it exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from troupe.cli.bench.train import GPU_SWITCHES, TrainBench, measure_switches, split_threads


def test_bench_train_json_reports_local_remote_and_bound(tmp_path: Path) -> None:
    """A tiny run: this checks the command and its figures, not the machine's speed."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    seen: set[psutil.Process] = set()
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "troupe.cli.main",
                "bench",
                "train",
                "--json",
                "--steps",
                "4",
                "--repeat",
                "1",
            ],
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # its own group: on a failure the node and its workers go too
        )
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            # Bounded poll of the bench's descendants (its node's workers, the encoding-alone
            # processes), to check afterwards that each of them is gone.
            try:
                seen.update(psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.1)
        proc.wait(timeout=1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        survivors = [p for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for p in survivors:
            p.kill()
    assert proc.returncode == 0, err.read_text()
    assert seen, "the bench started no process: no encoder actors ran"
    assert not survivors, f"processes outlived the bench: {[p.pid for p in survivors]}"
    fig = json.loads(out.read_text())
    for key in ("local_samples_per_s", "remote_samples_per_s", "bound_samples_per_s", "remote_vs_bound"):
        assert fig[key] > 0, key
    assert fig["remote_vs_bound"] == pytest.approx(fig["remote_samples_per_s"] / fig["bound_samples_per_s"])
    assert fig["bound_samples_per_s"] == pytest.approx(
        min(fig["encode_alone_samples_per_s"], fig["train_alone_samples_per_s"])
    )
    assert fig["together_bound_samples_per_s"] > 0
    assert fig["remote_vs_together_bound"] == pytest.approx(
        fig["remote_samples_per_s"] / fig["together_bound_samples_per_s"]
    )
    by_k = fig["remote_samples_per_s_by_inflight"]
    assert set(by_k) == {"1", "2", "4", "8"} and fig["inflight"] in (1, 2, 4, 8)
    assert fig["remote_samples_per_s"] == max(by_k.values()) == by_k[str(fig["inflight"])]
    assert fig["steps"] == 4 and fig["repeat"] == 1 and fig["group_size"] == 4
    cpu = fig["cpu_ms_per_sample"]
    assert set(cpu) == {
        "encode_alone",
        "train_alone",
        "encode_together",
        "train_together",
        "remote_trainer",
        "remote_encoders",
    }
    assert all(value > 0 for value in cpu.values()), cpu
    stages = fig["remote_stages"]
    assert stages["steps"] == 4 and stages["samples_per_s"] == pytest.approx(fig["remote_samples_per_s"])
    # The same seeds and batches through the actors as inside the trainer: the same losses.
    assert fig["max_loss_diff"] < 1e-4
    if not torch.cuda.is_available():
        assert fig["gpu_switches"] is None and "no CUDA device" in fig["gpu_switches_note"]
    else:
        assert set(fig["gpu_switches"]) == {"baseline", "compile", "cudnn_benchmark", "bf16"}


def test_the_gpu_switch_figures_take_the_encoder_actors_path() -> None:
    """On CPU the actor turns each switch off, so this checks the loop and its keys, not speed."""
    bench = TrainBench(batch_size=2, frames=8, side=16, vae_channels=4, group_size=1)
    figures, errors = measure_switches(bench, "cpu", rounds=1)
    assert errors == {} and set(figures) == {"baseline", *GPU_SWITCHES}
    assert all(rate is not None and rate > 0 for rate in figures.values())


@pytest.mark.parametrize(
    ("cores", "actors", "expected"), [(2, 1, (1, 1)), (1, 1, (1, 1)), (8, 2, (4, 2)), (16, 40, (8, 1))]
)
def test_the_cores_are_split_between_trainer_and_encoders(
    cores: int, actors: int, expected: tuple[int, int]
) -> None:
    assert split_threads(cores, actors) == expected


@pytest.mark.parametrize("option", ["--inflight", "--group-size"])
def test_bad_options_exit_2_naming_the_option(option: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "bench", "train", option, "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and option in done.stderr
