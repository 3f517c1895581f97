"""A training extended with more steps (as ``already complete`` advises) follows the documented
LR rule: a new cosine from train.lr over the extension, said in one line; it had recomputed the
cosine over the new steps, jumping back from 0 to 0.35 x train.lr at the resume, silently. An
extension interrupted and resumed still ends as the extension run in one go."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
from trainer_testdata import train_data, wait_progress, write_clips

from troupe.actors.training.checkpoint import checkpoint_path
from troupe.actors.training.rank_run import RankRun, StartRequest
from troupe.actors.training.rank_session import RankSession
from troupe.actors.training.trainer import TrainerActor
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.transports.base import MemoryHub

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

LR, WARMUP = 1e-3, 1


def _config(data: Path, steps: int) -> dict[str, Any]:
    return train_data(data, steps, local_encoding=True, lr=LR, warmup_steps=WARMUP,
                      checkpoint_every=1, keep_checkpoints=20)  # fmt: skip


async def _train(out: Path, config: dict[str, Any]) -> dict[str, Any]:
    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:
        rank = await runtime.spawn(TrainerActor(threads=1), "trainer")
        await rank.ask("start", {"config": config, "out": str(out), "rank": 0, "world_size": 1})
        return await wait_progress(rank, lambda p: p["state"] == "done")


def _session(out: Path, config: dict[str, Any]) -> RankSession:
    """The objects a rank resuming in ``out`` builds: the plan, and the rate of its next step."""
    request = StartRequest.parse({"config": config, "out": str(out), "rank": 0, "world_size": 1})
    return RankSession(RankRun(request))


async def test_an_extension_follows_a_new_cosine_and_says_so(tmp_path: Path) -> None:
    data, out = write_clips(tmp_path / "data"), tmp_path / "out"
    await _train(out, _config(data, 4))
    session = await anyio.to_thread.run_sync(_session, out, _config(data, 6))
    assert session.optimizer.param_groups[0]["lr"] == LR  # step 5: the new cosine's full rate
    assert session.plan == [[0, 4], [4, 6]]
    assert session.run.note is not None and session.run.note.startswith(
        "steps 5-6 extend the training past step 4, where its cosine schedule ended"
    )
    extension = await _train(out, _config(data, 6))
    assert extension["note"] == session.run.note  # what the run says (the driver, once)

    shutil.rmtree(checkpoint_path(out / "checkpoints", 6))  # resumed from step 5, of the extension
    at_5 = await anyio.to_thread.run_sync(_session, out, _config(data, 6))
    assert at_5.plan == [[0, 4], [4, 6]] and at_5.run.note is None
    assert at_5.optimizer.param_groups[0]["lr"] == LR * 0.5  # step 6: halfway down the new cosine


async def test_an_extension_interrupted_and_resumed_ends_as_the_extension_in_one_go(tmp_path: Path) -> None:
    data = write_clips(tmp_path / "data")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    await _train(whole, _config(data, 4))
    extended = await _train(whole, _config(data, 8))
    # The extension stopped after step 6: what it left (its checkpoints to step 6).
    shutil.copytree(whole, cut)
    for step in (7, 8):
        shutil.rmtree(checkpoint_path(cut / "checkpoints", step))
    resumed = await _train(cut, _config(data, 8))
    assert resumed["note"] is None
    assert resumed["result"]["losses"] == extended["result"]["losses"][2:]
    assert resumed["result"]["weights_sha256"] == extended["result"]["weights_sha256"]
