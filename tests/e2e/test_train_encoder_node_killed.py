"""An encoder's node killed while a training run on a master's cluster trains: the run starts
that encoder again on a live node, says so, and the rank's groups reach it there (it answers
groups: only a rank asks an encoder to encode). The other encoder used to carry every group until
the run ended, since a lost encoder never restarts the ranks. Ctrl-C then ends the run as usual."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio
import pytest

from support.chaos import TaskMaster
from support.clip_data import write_run
from support.tagged_nodes import tagged_nodes
from support.train_run_cli import config_copy, finish, troupe
from troupe.actors.training.checkpoint import COMMITTED
from troupe.runtime import TroupeError
from troupe.runtime.core.client import connect

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NODES = {
    "enc-a": ("127.0.0.2", "encoder"),
    "enc-b": ("127.0.0.3", "encoder"),
    "trn": ("127.0.0.4", "trainer"),
}
SUPERVISION = """
[supervision.kinds.trainer]
progress_timeout_s = 0.0
heartbeat_timeout_s = 30.0
"""
WAIT_S = 300  # bounds on polls of a condition, never on speed


async def _groups_answered(node: str, actor: str) -> int:
    """The groups ``actor`` answered, asked by name through ``node`` (0: no answer yet)."""
    try:
        async with connect(node) as rt:
            stats = await rt.ref(actor).ask("stats", None, timeout=2.0)
    except TroupeError:
        return 0
    return int(stats.get("groups") or 0) if isinstance(stats, dict) else 0


def test_an_encoder_on_a_killed_node_serves_again_from_a_live_node(
    tmp_path: Path, master: TaskMaster
) -> None:
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(4)})
    changes = {
        "train": {"dataset": str(dataset), "steps": 100_000},  # it ends with the Ctrl-C below
        "encoders": {"tags": ["encoder"]},
        "trainers": {"tags": ["trainer"]},
    }
    config = config_copy(tmp_path / "train.toml", "train.toml", changes)
    out = tmp_path / "out"
    run = ("run", str(config), "--out", str(out), "--master", master.endpoint)
    with tagged_nodes(master, tmp_path, NODES, SUPERVISION) as nodes, troupe(*run) as (proc, _):
        deadline = time.monotonic() + WAIT_S
        while not any((p / COMMITTED).is_file() for p in (out / "checkpoints").glob("step-*")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint was committed"
            time.sleep(0.05)
        nodes["enc-b"].proc.send_signal(signal.SIGKILL)  # train-encode-1's node, with its workers
        nodes["enc-b"].proc.wait(timeout=30)
        deadline = time.monotonic() + WAIT_S
        while anyio.run(_groups_answered, nodes["enc-a"].endpoint, "train-encode-1") == 0:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "train-encode-1 answered no group on a live node"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        code, stdout, stderr = finish(proc, timeout=120)
    said = " ".join((stdout + stderr).split())
    assert code == 130, said[-3000:]
    assert "train-encode-0 on enc-a, train-encode-1 on enc-b" in said, said[-3000:]
    assert "w-train-encode-1: node enc-b is gone; it starts again on enc-a" in said, said[-3000:]
    assert "restarting every rank" not in said  # an encoder lost restarts no rank
