"""A stop that ends ``run_training`` by raising (it landed on an await of the run, not as its
processes stopped) once the final checkpoint is committed: ``troupe run TRAIN.toml`` says what a
rerun says (``already complete``'s object with --json) and returns, so the command exits 0; a
stop before the final checkpoint stays a stop (the cancellation raised, the ``stopped:`` line).

The run is a stand-in that waits to be stopped, over an --out whose checkpoints are real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import troupe.actors.training.train_run as train_run
from support.train_run_cli import config_copy
from troupe.actors.training.checkpoint import Checkpointer, checkpoint_path
from troupe.actors.training.train_config import load_train_config
from troupe.cli.commands.run_train import _train

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

STEPS = 3


async def _stopped_run(*_args: Any, **_kwargs: Any) -> Any:
    await anyio.sleep_forever()  # until the stop: what a run's await does with a stop


def _stopped_train(tmp_path: Path, steps: int) -> tuple[Path, bool]:
    """``_train`` stopped at once over an --out whose checkpoint of step ``STEPS`` is committed;
    the --out, and whether ``_train`` returned (else it raised the stop)."""
    dataset = tmp_path / "data"
    (dataset / ".troupe" / "episodes").mkdir(parents=True)
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}})
    cfg = load_train_config(config)
    out = tmp_path / "out"
    model = torch.nn.Linear(2, 2)
    checkpointer = Checkpointer(out / "checkpoints", every=STEPS)
    checkpointer.save(STEPS, model, torch.optim.SGD(model.parameters(), lr=0.1))
    checkpointer.close()
    returned: list[bool] = []

    async def main() -> None:
        with anyio.CancelScope() as stop:
            stop.cancel()
            await _train(cfg, out, steps, "tcp://127.0.0.1:31999", None, False, True)
            returned.append(True)

    anyio.run(main)
    return out, bool(returned)


def test_a_stop_once_the_final_checkpoint_is_committed_says_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(train_run, "run_training", _stopped_run)
    out, returned = _stopped_train(tmp_path, STEPS)
    assert returned, "the stop was raised: the command would exit 130"
    final = str(checkpoint_path(out / "checkpoints", STEPS).resolve())
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"already_complete": True, "step": STEPS, "checkpoint": final}
    assert "stopped" not in captured.err, captured.err


def test_a_stop_before_the_final_checkpoint_stays_a_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(train_run, "run_training", _stopped_run)
    out, returned = _stopped_train(tmp_path, STEPS * 2)
    assert not returned
    captured = capsys.readouterr()
    assert captured.out == ""
    said = " ".join(captured.err.split())
    final = checkpoint_path(out / "checkpoints", STEPS).resolve()
    assert f"stopped: checkpoint at step {STEPS} in {final}; the same command run again resumes" in said
