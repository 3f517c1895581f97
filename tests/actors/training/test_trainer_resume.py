"""A trainer rank stopped or SIGKILLed after a checkpoint resumes from it, and ends with the
weights of an uninterrupted run with the same seeds.

The interrupted runs read through ``GatedClips``: after 8 clips (4 steps of 2) reading waits for
a gate file, so the rank is known to stand after step 4 (checkpoints 2 and 4 committed) when the
test stops or kills it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from trainer_testdata import (
    GATED,
    TRAINER_WORKER,
    WAIT_S,
    node_config,
    train_data,
    wait_progress,
    write_clips,
)

from troupe import TroupeError
from troupe.actors.training.checkpoint import COMMITTED, checkpoint_path
from troupe.actors.training.trainer import TrainerActor
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.transports.base import MemoryHub

# The in-process runs checkpoint without a process group: DCP warns that it assumes one process.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

STEPS = 6


def _done(p: dict[str, Any]) -> bool:
    return p["state"] == "done"


def _at_step_4(p: dict[str, Any]) -> bool:
    return p["step"] == 4 and p["checkpoint"] == 4


async def test_a_stopped_rank_resumes_in_a_new_actor_with_the_same_final_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_clips(tmp_path / "data")
    gate = tmp_path / "gate"
    monkeypatch.setenv("TROUPE_TEST_GATE", str(gate))
    monkeypatch.setenv("TROUPE_TEST_GATE_AFTER", "8")

    def start(out: str, **train: Any) -> dict[str, Any]:
        config = train_data(data, STEPS, local_encoding=True, **train)
        return {"config": config, "out": str(tmp_path / out), "rank": 0, "world_size": 1}

    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:
        first = await runtime.spawn(TrainerActor(threads=1), "trainer-a")
        assert (await first.ask("progress", timeout=30))["state"] == "idle"
        assert await first.ask("start", start("cut", dataset_class=GATED), timeout=30) == {
            "started": True, "resumed_from": None,
        }  # fmt: skip
        await wait_progress(first, _at_step_4)
        assert (await first.ask("stop", timeout=30))["stopped"] is True
        gate.touch()  # the read waiting after step 4 returns; the next step sees the stop
        stopped = await wait_progress(first, lambda p: p["state"] == "failed", timeout=WAIT_S)
        assert stopped["error"] == "stopped" and stopped["step"] == 4 and stopped["checkpoint"] == 4
        assert not checkpoint_path(tmp_path / "cut" / "checkpoints", 6).exists()

        torch.manual_seed(12345)  # new process state: the checkpoint must restore what matters
        second = await runtime.spawn(TrainerActor(threads=1), "trainer-b")
        reply = await second.ask("start", start("cut", dataset_class=GATED), timeout=30)
        assert reply == {"started": True, "resumed_from": 4}
        resumed = await wait_progress(second, _done)

        third = await runtime.spawn(TrainerActor(threads=1), "trainer-c")
        await third.ask("start", start("whole", keep_checkpoints=2), timeout=30)
        whole = await wait_progress(third, _done)

    assert resumed["resumed_from"] == 4 and len(resumed["result"]["losses"]) == 2
    assert resumed["result"]["losses"] == whole["result"]["losses"][4:]
    assert resumed["result"]["weights_sha256"] == whole["result"]["weights_sha256"]
    final = Path(resumed["result"]["final_checkpoint"])
    assert final == checkpoint_path(tmp_path / "cut" / "checkpoints", STEPS) and (final / COMMITTED).is_file()
    assert whole["step"] == whole["steps"] == STEPS and whole["checkpoint"] == STEPS
    kept = sorted(p.name for p in (tmp_path / "whole" / "checkpoints").iterdir())
    assert kept == ["step-000000004", "step-000000006"]  # keep_checkpoints = 2
    assert whole["timings"]["steps"] == STEPS and whole["samples_per_s"] > 0 and whole["requests"] == []


@pytest.mark.e2e
@pytest.mark.timeout(300)  # a node and its worker start slowly on a loaded machine
async def test_a_sigkilled_trainer_worker_resumes_from_its_checkpoint(
    troupe_cluster: Any, tmp_path: Path
) -> None:
    data = write_clips(tmp_path / "data")
    gate = tmp_path / "gate"
    cluster = troupe_cluster(
        node_config(TRAINER_WORKER.format(name="trainer")),
        env={"TROUPE_TEST_GATE": str(gate), "TROUPE_TEST_GATE_AFTER": "8"},
    )

    def start(out: str) -> dict[str, Any]:
        config = train_data(data, STEPS, dataset_class=GATED, local_encoding=True)
        return {"config": config, "out": str(tmp_path / out), "rank": 0, "world_size": 1}

    async with cluster.client() as rt:
        trainer = rt.ref("trainer")
        await trainer.ask("start", start("cut"), timeout=30)
        await wait_progress(trainer, _at_step_4)
        before = cluster.worker_in(await cluster.supervision(), "w-trainer")
        os.kill(before["pid"], signal.SIGKILL)
        await cluster.wait_for(
            lambda s: (
                cluster.worker_in(s, "w-trainer")["restarts"] == 1
                and cluster.worker_in(s, "w-trainer")["state"] == "running"
            )
        )
        gate.touch()
        with anyio.fail_after(WAIT_S):  # the restarted actor answers once its address is known
            while True:
                try:
                    assert (await trainer.ask("progress", timeout=1))["state"] == "idle"
                    break
                except TroupeError:  # the old address, or not registered yet
                    await anyio.sleep(0.05)
        assert await trainer.ask("start", start("cut"), timeout=30) == {"started": True, "resumed_from": 4}
        resumed = await wait_progress(trainer, _done)
        await trainer.ask("start", start("whole"), timeout=30)
        whole = await wait_progress(trainer, _done)
    assert resumed["result"]["losses"] == whole["result"]["losses"][4:]
    assert resumed["result"]["weights_sha256"] == whole["result"]["weights_sha256"]
    assert whole["step"] == STEPS and resumed["step"] == STEPS
