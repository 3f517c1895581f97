"""lc 4: a training run seen from outside, as ``troupe ctl status`` and Prometheus see it: a rank's
step, loss, samples/s and last committed checkpoint are the trainer actor's figures
(``metrics()``, in the worker's ``status`` as ``actor_metrics``); and the run's own node names the
run's ``--out`` (``out``), as a pipeline run's does. Both had shown nothing of the training."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_testdata import train_data, wait_progress, write_clips

from support.port_range import test_endpoint
from troupe.actors.training.train_cluster import training_cluster
from troupe.actors.training.trainer import TrainerActor
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.metrics.actor_metrics import read_actor_metrics
from troupe.runtime.transports.base import MemoryHub

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def test_an_idle_rank_says_it_is_not_running() -> None:
    figures = read_actor_metrics({"train-rank-0": TrainerActor(threads=1)})["train-rank-0"]
    assert figures == {"running": 0.0, "step": 0.0, "steps": 0.0, "samples_per_s": 0.0}


async def test_a_rank_s_step_loss_rate_and_checkpoint_are_its_figures(tmp_path: Path) -> None:
    dataset = write_clips(tmp_path / "run")
    config = train_data(dataset, 4, local_encoding=True, checkpoint_every=2)
    actor = TrainerActor(threads=1)
    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:
        rank = await runtime.spawn(actor, "train-rank-0")
        await rank.ask("start", {"config": config, "out": str(tmp_path / "out"), "rank": 0, "world_size": 1})
        done = await wait_progress(rank, lambda p: p["state"] == "done")
        figures = read_actor_metrics({"train-rank-0": actor})["train-rank-0"]
    assert figures["running"] == 0 and figures["step"] == 4 and figures["steps"] == 4
    assert figures["loss"] == done["loss"] and figures["samples_per_s"] == done["samples_per_s"] > 0
    assert figures["checkpoint_step"] == done["checkpoint"] == 4
    assert not any(name.endswith("_total") for name in figures)  # gauges: a restart starts them anew


async def test_the_run_s_own_node_names_its_out(tmp_path: Path) -> None:
    out = tmp_path / "train-out"
    (out / "logs").mkdir(parents=True)
    async with training_cluster(None, test_endpoint(), out) as (rt, hosts):
        status = await rt.control(hosts[0].endpoint, "status", None, timeout=30)
    assert status["out"] == str(out)
