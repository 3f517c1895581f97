"""``troupe run TRAIN.toml`` says ``already complete`` only over a last checkpoint a resume would
load: the folder's name and a ``COMMITTED`` file had been enough, so an empty marker, a part cut
short or a stray copy named ``step-000000999`` was "already complete" (exit 0), and only a run
that resumed found it damaged. Refused now as the resume refuses it, before anything starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from support.train_run_cli import config_copy, run_cli
from troupe.actors.training.checkpoint import Checkpointer, checkpoint_path

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _trained(tmp_path: Path) -> tuple[Path, Path]:
    """A config of 3 steps and an --out whose checkpoint of step 3 is committed."""
    dataset = tmp_path / "data"
    (dataset / ".troupe" / "episodes").mkdir(parents=True)
    config = config_copy(
        tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset), "steps": 3}}
    )
    out = tmp_path / "out"
    model = torch.nn.Linear(2, 2)
    checkpointer = Checkpointer(out / "checkpoints", every=3)
    checkpointer.save(3, model, torch.optim.SGD(model.parameters(), lr=0.1))
    checkpointer.close()
    return config, out


def test_an_intact_last_checkpoint_is_already_complete(tmp_path: Path) -> None:
    config, out = _trained(tmp_path)
    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), timeout=120)
    assert code == 0, stdout + stderr
    assert "already complete:" in stdout and "step-000000003 is step 3" in stdout, stdout


@pytest.mark.parametrize("damage", ["empty marker", "part cut short", "stray copy"])
def test_a_damaged_last_checkpoint_is_not_complete_but_refused_as_a_resume_refuses_it(
    tmp_path: Path, damage: str
) -> None:
    config, out = _trained(tmp_path)
    last = checkpoint_path(out / "checkpoints", 3)
    if damage == "empty marker":
        (last / "COMMITTED").write_text("")
        why = "its COMMITTED marker does not hold its step"
    elif damage == "part cut short":
        (part,) = last.glob("*.distcp")
        with part.open("r+b") as f:
            f.truncate(part.stat().st_size // 2)
        why = "changed since it was written"
    else:
        last = checkpoint_path(out / "checkpoints", 999)
        shutil.copytree(checkpoint_path(out / "checkpoints", 3), last)
        why = "its COMMITTED marker does not hold its step"
    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), timeout=120)
    assert code == 1, stdout + stderr
    assert "already complete" not in stdout, stdout
    line = " ".join(stderr.split())
    assert f"checkpoint '{last}' cannot be loaded" in line and why in line, stderr
    assert "move it away to resume from the one before, or run with --fresh" in line, stderr
