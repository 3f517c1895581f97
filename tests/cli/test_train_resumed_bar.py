"""``troupe run TRAIN.toml`` over an --out whose checkpoint of step 3 is committed: its progress bar
starts at the step the run resumes from, before the ranks first answer (it showed "0/5"), and the
report says the steps this run trained. The run is a stand-in that returns at once, over an
--out whose checkpoint is real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import troupe.actors.training.train_run as train_run
from support.train_run_cli import config_copy
from troupe.actors.training.checkpoint import Checkpointer
from troupe.actors.training.train_config import load_train_config
from troupe.actors.training.train_result import TrainRunResult
from troupe.cli.commands.run_train import _train

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


async def _resumed_run(*_args: Any, **_kwargs: Any) -> TrainRunResult:
    # No progress told: the bar is shown as it starts, before any rank answers.
    return TrainRunResult(steps=5, losses=[1.0, 0.9], loss=0.9, samples_per_s=1.0, timings={}, requests={},
                          restarts=0, checkpoints=[], placement={}, wall_s=1.0, resumed_from=3,
                          first_step=3)  # fmt: skip


def _run(tmp_path: Path, fresh: bool) -> None:
    dataset = tmp_path / "data"
    (dataset / ".troupe" / "episodes").mkdir(parents=True)
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}})
    out = tmp_path / "out"
    model = torch.nn.Linear(2, 2)
    checkpointer = Checkpointer(out / "checkpoints", every=3)
    checkpointer.save(3, model, torch.optim.SGD(model.parameters(), lr=0.1))
    checkpointer.close()
    anyio.run(_train, load_train_config(config), out, 5, "tcp://127.0.0.1:31999", None, fresh, False)


def test_the_bar_starts_at_the_step_resumed_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(train_run, "run_training", _resumed_run)
    _run(tmp_path, fresh=False)
    out = capsys.readouterr().out
    bar = next(line for line in out.splitlines() if line.startswith("train "))
    assert " 3/5 " in bar and " 0/5 " not in bar, bar
    assert "trained 2 steps (4-5, resumed from step 3)" in out, out


def test_a_fresh_run_s_bar_starts_at_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(train_run, "run_training", _resumed_run)
    _run(tmp_path, fresh=True)  # the stand-in does not delete the checkpoint: the bar does not read it
    bar = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("train "))
    assert " 0/5 " in bar, bar
