"""Two trainer ranks (DDP over gloo, each a process of its own) agree on each step's loss before
``backward``: both record the mean of their losses, and a loss that is not finite on one rank
stops both at that step with LossNotFinite. The rank whose loss was nan used to stop alone while
the other waited in ``backward``'s gradient all-reduce for it, and each rank recorded the loss of
its own shard (the run reported rank 0's).

Run as a script (``python test_rank_loss_agreement.py DIR STEPS DIVERGES_AT``, with torchrun's
variables set) it is one rank: a ``TrainerActor`` that joins the group from those variables and
trains ``DIR/data`` into ``DIR/out``; rank 1's loss is nan at step ``DIVERGES_AT`` (0: never). It
writes its last progress and its own loss of every step to ``DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
from trainer_testdata import train_data, wait_progress, write_clips

from support.rank_processes import run_ranks
from troupe.actors.training import trainer
from troupe.actors.training.checkpoint import checkpoint_path
from troupe.actors.training.ranks import Rendezvous
from troupe.actors.training.trainer import TrainerActor
from troupe.models.world_model import FlowLoss, WorldModel
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.testing.plugin import free_endpoint
from troupe.runtime.transports.base import MemoryHub

CHILD_TIMEOUT_S = 90  # under pytest-timeout's 120 s, so the ranks' logs are reported
TESTS = Path(__file__).resolve().parents[2]
DIVERGES_AT = 3


def _run_ranks(folder: Path, steps: int, diverges_at: int) -> list[dict[str, Any]]:
    """Both ranks' ``rank<r>.json``, once both processes exited 0 (bounded: a rank that hangs
    fails the test, with the ranks' logs)."""
    write_clips(folder / "data")
    port = urlsplit(free_endpoint()).port
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    logs = [folder / f"rank{r}.log" for r in range(2)]
    cmd = [sys.executable, __file__, str(folder), str(steps), str(diverges_at)]
    codes = run_ranks(cmd, env, logs, CHILD_TIMEOUT_S)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_nan_loss_on_one_rank_stops_both_at_that_step(tmp_path: Path) -> None:
    ranks = _run_ranks(tmp_path, 4, DIVERGES_AT)
    for rank in ranks:
        progress = rank["progress"]
        assert progress["state"] == "failed" and progress["final"] is True, progress
        assert (
            f"LossNotFinite: step {DIVERGES_AT}: the loss is nan (not finite on rank 1 of 2; "
            "train.lr = 0.001)" in progress["error"]
        )
        # The step-2 checkpoint may still be committing as the failure is reported (a loaded
        # machine): what stays on disk is checked below.
        assert progress["step"] == DIVERGES_AT - 1 and progress["checkpoint"] in (2, None), progress
    checkpoints = tmp_path / "out" / "checkpoints"
    assert checkpoint_path(checkpoints, 2).exists() and not checkpoint_path(checkpoints, DIVERGES_AT).exists()


def test_two_ranks_record_the_mean_of_their_losses(tmp_path: Path) -> None:
    ranks = _run_ranks(tmp_path, 2, 0)
    local = [rank["local"] for rank in ranks]
    assert len(local[0]) == len(local[1]) == 2 and local[0] != local[1]  # each its own shard
    mean = [(a + b) / 2 for a, b in zip(local[0], local[1], strict=True)]
    for rank in ranks:
        assert rank["progress"]["state"] == "done"
        assert rank["progress"]["result"]["losses"] == pytest.approx(mean, rel=1e-6)


async def _from_env(*_: Any, **__: Any) -> Rendezvous:
    return Rendezvous.from_env()


async def _train(folder: Path, rank: int, steps: int) -> dict[str, Any]:
    config = train_data(folder / "data", steps, local_encoding=True, schedule="constant")
    start = {"config": config, "out": str(folder / "out"), "rank": rank, "world_size": 2}
    async with Runtime("node", f"rank-{rank}", MemoryHub().transport()) as runtime:
        ref = await runtime.spawn(TrainerActor(threads=1), "trainer")
        await ref.ask("start", start)
        return await wait_progress(ref, lambda p: p["state"] in ("done", "failed"), CHILD_TIMEOUT_S)


def _rank_main(folder: Path, steps: int, diverges_at: int) -> None:
    rank = int(os.environ["RANK"])
    local: list[float] = []
    loss = WorldModel.loss

    def noted(self: WorldModel, *args: Any, **kwargs: Any) -> FlowLoss:
        out = loss(self, *args, **kwargs)
        local.append(float(out.loss.detach()))
        if rank == 1 and len(local) == diverges_at:
            return FlowLoss(out.loss * float("nan"), *out[1:])
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WorldModel, "loss", noted)
        # The group from torchrun's variables: each rank has a runtime of its own here.
        patch.setattr(trainer, "rendezvous_from", _from_env)
        progress = anyio.run(_train, folder, rank, steps)
    (folder / f"rank{rank}.json").write_text(json.dumps({"progress": progress, "local": local}))


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
