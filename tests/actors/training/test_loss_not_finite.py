"""A loss that goes nan ends the training at that step: the rank fails with a reason that names
the step and the learning rate, says the failure is final (a restart from the last checkpoint
would diverge again), and writes no checkpoint for it; the checkpoints before it stay. It used to
train on, exit 0, write nan weights, and rotate the good checkpoints away."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trainer_testdata import train_data, wait_progress, write_clips

from troupe.actors.training import rank_session
from troupe.actors.training.checkpoint import checkpoint_path
from troupe.actors.training.trainer import TrainerActor
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.transports.base import MemoryHub

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

DIVERGES_AT = 3


async def test_a_nan_loss_fails_the_rank_for_good_and_keeps_the_earlier_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forward = rank_session._LossOf.forward
    calls = {"n": 0}

    def diverging(self: Any, *args: Any) -> Any:
        calls["n"] += 1
        loss = forward(self, *args)
        return loss * float("nan") if calls["n"] >= DIVERGES_AT else loss

    monkeypatch.setattr(rank_session._LossOf, "forward", diverging)
    data = write_clips(tmp_path / "data")
    config = train_data(data, 6, local_encoding=True)
    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:
        rank = await runtime.spawn(TrainerActor(threads=1), "trainer")
        await rank.ask("start", {"config": config, "out": str(tmp_path / "out"), "rank": 0, "world_size": 1})
        failed = await wait_progress(rank, lambda p: p["state"] == "failed")
    assert failed["final"] is True
    assert f"LossNotFinite: step {DIVERGES_AT}: the loss is nan (train.lr = 0.001)" in failed["error"]
    assert failed["step"] == DIVERGES_AT - 1 and failed["checkpoint"] == 2
    checkpoints = tmp_path / "out" / "checkpoints"
    assert checkpoint_path(checkpoints, 2).exists() and not checkpoint_path(checkpoints, DIVERGES_AT).exists()
