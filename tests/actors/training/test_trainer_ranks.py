"""Two trainer ranks in two worker processes (DDP over gloo, the rendezvous through troupe's
directory) train to equal weights; their checkpoint resumes on one rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from trainer_testdata import TRAINER_WORKER, node_config, train_data, wait_progress, write_clips

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]  # nodes start slowly on a loaded machine

STEPS = 4


async def test_two_ranks_train_to_equal_weights_and_their_checkpoint_resumes_on_one(
    troupe_cluster: Any, tmp_path: Path
) -> None:
    data = write_clips(tmp_path / "data")
    cluster = troupe_cluster(
        node_config(TRAINER_WORKER.format(name="rank-0"), TRAINER_WORKER.format(name="rank-1"))
    )
    out = tmp_path / "out"

    def start(rank: int, world_size: int, steps: int = STEPS) -> dict[str, Any]:
        config = train_data(data, steps, local_encoding=True, schedule="constant")
        return {"config": config, "out": str(out), "rank": rank, "world_size": world_size,
                "rendezvous": "rdv-ranks-test"}  # fmt: skip

    async with cluster.client() as rt:
        ranks = [rt.ref("rank-0"), rt.ref("rank-1")]
        replies: dict[int, dict[str, Any]] = {}

        async def begin(rank: int) -> None:
            replies[rank] = await ranks[rank].ask("start", start(rank, 2), timeout=30)

        async with anyio.create_task_group() as tg:
            tg.start_soon(begin, 1)  # rank 1 first: it waits for rank 0's rendezvous
            tg.start_soon(begin, 0)
        assert replies == {
            0: {"started": True, "resumed_from": None},
            1: {"started": True, "resumed_from": None},
        }
        done = [await wait_progress(ref, lambda p: p["state"] == "done") for ref in ranks]

        # One rank picks up the two ranks' checkpoint and trains on.
        assert await ranks[0].ask("start", start(0, 1, steps=STEPS + 2), timeout=30) == {
            "started": True,
            "resumed_from": STEPS,
        }
        alone = await wait_progress(ranks[0], lambda p: p["state"] == "done")

    assert [p["step"] for p in done] == [STEPS, STEPS]
    assert done[0]["result"]["weights_sha256"] == done[1]["result"]["weights_sha256"]
    # Each rank trained on its own shard of every step; both record the mean of their losses
    # (test_rank_loss_agreement.py).
    assert done[0]["result"]["losses"] == done[1]["result"]["losses"]
    assert alone["step"] == STEPS + 2 and len(alone["result"]["losses"]) == 2
    assert alone["result"]["weights_sha256"] != done[0]["result"]["weights_sha256"]
