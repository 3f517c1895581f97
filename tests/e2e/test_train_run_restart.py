"""A trainer rank's worker SIGKILLed mid-run, after a checkpoint: ``troupe run TRAIN.toml``
stops and starts the ranks again, they resume from the last committed checkpoint, the run
finishes, and its report counts one restart and losses that continue from the checkpoint. Ctrl-C
stops every process the run started, after the rank checkpointed the step it stopped at, and the
command exits 130."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import anyio
import psutil
import pytest

from support.clip_data import write_run
from support.train_run_cli import config_copy, finish, troupe
from troupe.actors.training.checkpoint import COMMITTED
from troupe.cli.master_client import master_call
from troupe.runtime.testing.plugin import import_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

STEPS = 60
EVERY = 3


def test_a_killed_rank_restarts_every_rank_from_the_last_checkpoint(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(4)})
    config = config_copy(
        tmp_path / "train.toml",
        "train.toml",
        {"train": {"dataset": str(dataset), "steps": STEPS, "checkpoint_every": EVERY, "max_restarts": 2}},
    )
    out = tmp_path / "out"
    with troupe("run", str(config), "--out", str(out), "--json") as (proc, node):
        deadline = time.monotonic() + 300
        while not any((p / COMMITTED).is_file() for p in (out / "checkpoints").glob("step-*")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint was committed"
            time.sleep(0.05)
        # In-process, not `troupe ctl chaos kill`: a CLI's start-up (seconds on a loaded box) is
        # as long as the rest of the run, which would then finish before the kill.
        killed = anyio.run(master_call, node, "chaos", {"kind": "kill", "target": "w-train-rank-0"}, 30.0)
        assert set(killed["killed"]) == {"w-train-rank-0"}, killed
        code, stdout, stderr = finish(proc)
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    report = json.loads(stdout)
    assert report["restarts"] == 1, report
    assert report["steps"] == STEPS
    # The last start resumed from a committed checkpoint, and the losses go on from there.
    first = report["first_step"]
    assert 0 < first < STEPS and first % EVERY == 0, report
    assert len(report["losses"]) == STEPS - first
    assert report["loss"] == report["losses"][-1]
    assert Path(report["checkpoints"][-1]).name == f"step-{STEPS:09d}"
    # The restart says how the worker ended, as its node saw it (it said only "lost its worker").
    restarts = [
        json.loads(line)
        for line in (out / "logs" / "local.jsonl").read_text(encoding="utf-8").splitlines()
        if '"train_restart"' in line
    ]
    assert [r["event"] for r in restarts] == ["train_restart"], restarts
    assert "lost its worker (" in restarts[0]["reason"] and "SIGKILL" in restarts[0]["reason"], restarts


def test_ctrl_c_stops_every_process_the_run_started(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(4)})
    changes = {"train": {"dataset": str(dataset), "steps": STEPS, "checkpoint_every": EVERY}}
    config = config_copy(tmp_path / "train.toml", "train.toml", changes)
    out = tmp_path / "out"
    with troupe("run", str(config), "--out", str(out)) as (proc, _):
        deadline = time.monotonic() + 300
        while not any((p / COMMITTED).is_file() for p in (out / "checkpoints").glob("step-*")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint was committed"
            time.sleep(0.05)
        started = psutil.Process(proc.pid).children(recursive=True)
        assert len(started) >= 3  # the encoder and trainer workers, at least
        proc.send_signal(signal.SIGINT)
        code, stdout, stderr = finish(proc, timeout=120)
        _, alive = psutil.wait_procs(started, timeout=30)
    assert code == 130, stdout[-3000:] + stderr[-3000:]
    assert not alive, [p.pid for p in alive]
    # Nothing trained is lost: the rank checkpointed the step it stopped at (or found it saved).
    events = [
        json.loads(line)
        for log_file in (out / "logs").glob("*.jsonl")
        for line in log_file.read_text(encoding="utf-8").splitlines()
    ]
    stopped = [e for e in events if e["event"] == "train_rank_stopped"]
    assert len(stopped) == 1, stopped
    newest = max(
        int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*") if (p / COMMITTED).is_file()
    )
    assert newest == stopped[0]["step"], (newest, stopped)
    # The run's log says it stopped, and the checkpoint a rerun resumes from (lc 6: nothing did).
    run_stopped = [e for e in events if e["event"] == "train_stopped"]
    assert [e["checkpoint_step"] for e in run_stopped] == [newest], run_stopped
    # Its last line names that checkpoint and how to go on.
    said = " ".join(stderr.split())
    assert f"stopped: checkpoint at step {newest} in " in said, stderr[-3000:]
    assert "the same command run again resumes from it" in said, stderr[-3000:]


def test_a_diverging_run_fails_at_once_without_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loss that is nan (here: nan actions, from the first step) fails the run at that step,
    not restarted (it would diverge again), exit 1, naming the step and the learning rate; no
    checkpoint holds nan weights (``tests/actors/training/test_loss_not_finite.py``: the earlier
    ones stay)."""
    monkeypatch.setenv("PYTHONPATH", import_path())  # the ranks and encoders import NanClips
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(4)})
    train = {"dataset": str(dataset), "dataset_class": "support.nan_clips:NanClips", "steps": STEPS}
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {**train, "checkpoint_every": 1}})
    out = tmp_path / "out"
    with troupe("run", str(config), "--out", str(out)) as (proc, _):
        code, stdout, stderr = finish(proc)
    assert code == 1, stdout[-3000:] + stderr[-3000:]
    assert "LossNotFinite: step 1: the loss is nan (train.lr = 0.001)" in stderr, stderr[-3000:]
    assert "(not restarted: every restart would fail the same way)" in stderr
    assert "restarting every rank" not in stdout + stderr
    assert not list((out / "checkpoints").glob("step-*/" + COMMITTED))
