"""A master killed (SIGKILL) while a cluster's training run trains: the run reaches its rank and
encoders through their nodes, says once that the master does not answer, and ends when the rank
ends, with no restart. It had frozen at the master's death, taken the live rank for lost two
minutes later, and failed on the master's ``resolve`` (exit 1), though the rank had finished."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from support.chaos import TaskMaster
from support.clip_data import write_run
from support.tagged_nodes import tagged_nodes
from support.train_run_cli import config_copy
from troupe.actors.training.train_result import TrainProgress
from troupe.actors.training.train_run import run_training

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SUPERVISION = """
[supervision.kinds.trainer]
progress_timeout_s = 0.0
heartbeat_timeout_s = 30.0
"""
STEPS = 40


def test_a_run_whose_master_is_killed_finishes_when_its_rank_does(tmp_path: Path, master: TaskMaster) -> None:
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(4)})
    tags = {"encoders": {"tags": ["encoder"]}, "trainers": {"tags": ["trainer"]}}
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}, **tags})
    said: list[str] = []

    def progress(p: TrainProgress) -> None:
        if p.step >= 2 and master.proc.poll() is None:
            master.proc.kill()  # mid-training, the rank far from its last step

    nodes = {"enc": ("127.0.0.2", "encoder"), "trn": ("127.0.0.3", "trainer")}
    with tagged_nodes(master, tmp_path, nodes, SUPERVISION):
        result = anyio.run(
            lambda: run_training(
                config,
                tmp_path / "out",
                steps=STEPS,
                master=master.endpoint,
                on_progress=progress,
                on_event=said.append,
            )
        )
    assert master.proc.poll() is not None  # it was killed before the end
    assert result.steps == STEPS and result.restarts == 0, said
    # The line that says so comes once a ping to the master has timed out: the rank may be done
    # first (the fake cluster's test sees it said, tests/actors/training/test_train_master_gone.py).
    assert not [line for line in said if "answered nothing" in line or "restarting" in line], said
