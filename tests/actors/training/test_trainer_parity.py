"""The trainer actor with real encoder workers: encoding through the actors gives the losses and
final weights of encoding inside the trainer; bad starts are refused or reported, never hang."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trainer_testdata import (
    TRAINER_WORKER,
    node_config,
    train_data,
    trainer_encoder,
    wait_progress,
    write_clips,
)

from troupe import RemoteError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]  # nodes start slowly on a loaded machine

STEPS = 4
# The node's readiness bound (a poll of its workers' state, not a speed bound): the trainer waits
# for the node's template to import torch, which took more than the fixture's default 60 s under
# a full-suite load of 15-30 on two cores ("'w-trainer' starting (pid None, restarts 0)").
START_S = 200


def _start(data: Path, out: Path, encoders: list[str], **train: Any) -> dict[str, Any]:
    return {"config": train_data(data, STEPS, **train), "out": str(out), "rank": 0, "world_size": 1,
            "encoders": encoders}  # fmt: skip


async def test_remote_encoding_gives_the_losses_and_weights_of_local_encoding(
    troupe_cluster: Any, tmp_path: Path
) -> None:
    data = write_clips(tmp_path / "data")
    workers = [TRAINER_WORKER.format(name="trainer")] + [trainer_encoder(n) for n in ("enc-a", "enc-b")]
    cluster = troupe_cluster(node_config(*workers), timeout=START_S)
    async with cluster.client() as rt:
        trainer = rt.ref("trainer")
        await trainer.ask("start", _start(data, tmp_path / "local", [], local_encoding=True), timeout=30)
        local = await wait_progress(trainer, lambda p: p["state"] == "done")
        await trainer.ask("start", _start(data, tmp_path / "remote", ["enc-a", "enc-b"]), timeout=30)
        remote = await wait_progress(trainer, lambda p: p["state"] == "done")
        stats = [await rt.ref(name).ask("stats", timeout=30) for name in ("enc-a", "enc-b")]
    assert len(local["result"]["losses"]) == STEPS
    assert remote["result"]["losses"] == local["result"]["losses"]
    assert remote["result"]["weights_sha256"] == local["result"]["weights_sha256"]
    # 2 samples a step in groups of 1, round-robin over both actors: each got half.
    assert remote["requests"] == [STEPS, STEPS] and remote["retries"] == 0
    assert [s["groups"] for s in stats] == [STEPS, STEPS]
    assert local["requests"] == [] and remote["timings"]["samples"] == 2 * STEPS


async def test_a_bad_start_is_refused_and_an_unknown_encoder_is_reported(
    troupe_cluster: Any, tmp_path: Path
) -> None:
    data = write_clips(tmp_path / "data", episodes=1)
    cluster = troupe_cluster(node_config(TRAINER_WORKER.format(name="trainer")), timeout=START_S)
    async with cluster.client() as rt:
        trainer = rt.ref("trainer")
        bad = _start(data, tmp_path / "a", ["enc"])
        bad["config"]["train"]["steps"] = 0
        with pytest.raises(RemoteError, match=r"train\.steps: must be > 0 \(got 0\)"):
            await trainer.ask("start", bad, timeout=30)
        with pytest.raises(RemoteError, match=r"rank=2: expected 0\.\.0"):
            await trainer.ask("start", {**_start(data, tmp_path / "a", ["enc"]), "rank": 2}, timeout=30)
        with pytest.raises(RemoteError, match=r"encoders=\[\]"):
            await trainer.ask("start", _start(data, tmp_path / "a", []), timeout=30)
        assert (await trainer.ask("progress", timeout=30))["state"] == "idle"

        start = _start(data, tmp_path / "b", ["no-such-encoder"], deadline_s=10.0)
        assert (await trainer.ask("start", start, timeout=30))["started"] is True
        failed = await wait_progress(trainer, lambda p: p["state"] == "failed")
        assert "no-such-encoder" in failed["error"] and failed["step"] == 0

        missing = _start(tmp_path / "absent", tmp_path / "c", [], local_encoding=True)
        await trainer.ask("start", missing, timeout=30)
        failed = await wait_progress(trainer, lambda p: p["state"] == "failed")
        assert str(tmp_path / "absent") in failed["error"]
