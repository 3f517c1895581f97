"""Training placed on a cluster by resource tags: two nodes joined to one master on loopback,
one tagged ``encoder`` and one ``trainer``; the encoder actors run on the first, the rank on the
second (the result's placement says so, and the run trains); a config whose tags no node offers
is refused before anything starts, naming the tags."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import psutil
import pytest

from support.chaos import TaskMaster
from support.clip_data import write_run
from support.train_run_cli import config_copy
from troupe.actors.training.train_run import run_training
from troupe.runtime.errors import ConfigError
from troupe.runtime.testing.plugin import node_start_command, reap

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NODE = """
[node]
master = "{master}"
tags = ["{tag}"]
stop_grace_s = 5

[supervision.kinds.trainer]
progress_timeout_s = 0.0
heartbeat_timeout_s = 30.0
"""


def _endpoint_on(host: str) -> str:
    with socket.socket() as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


async def _wait_joined(master: TaskMaster, nodes: set[str]) -> None:
    """Until every node beats with its tags (a bounded poll)."""
    with anyio.fail_after(60):
        while True:
            status = await master.call("status")
            if {n["node"] for n in status["nodes"] if n["alive"] and n.get("tags")} >= nodes:
                return
            await anyio.sleep(0.1)


@pytest.fixture
def tagged_nodes(tmp_path: Path, master: TaskMaster) -> Iterator[None]:
    procs: list[subprocess.Popen[bytes]] = []
    children: list[psutil.Process] = []
    try:
        for name, host in (("enc", "127.0.0.2"), ("trn", "127.0.0.3")):
            config = tmp_path / f"{name}.toml"
            tag = "encoder" if name == "enc" else "trainer"
            config.write_text(NODE.format(master=master.endpoint, tag=tag), encoding="utf-8")
            procs.append(
                subprocess.Popen(
                    node_start_command(config, name, _endpoint_on(host), tmp_path / "logs"),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            )
        anyio.run(_wait_joined, master, {"enc", "trn"})
        yield
    finally:
        for proc in procs:
            try:
                children += psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        survivors = [pid for proc in procs for pid in reap(proc, children)]
        assert not survivors


def test_encoders_and_ranks_run_on_the_nodes_their_tags_name(
    tmp_path: Path, master: TaskMaster, tagged_nodes: None
) -> None:
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(4)})
    tags = {"encoders": {"tags": ["encoder"]}, "trainers": {"tags": ["trainer"]}}
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}, **tags})

    result = anyio.run(lambda: run_training(config, tmp_path / "out", steps=3, master=master.endpoint))
    assert result.placement == {"train-encode-0": "enc", "train-encode-1": "enc", "train-rank-0": "trn"}
    assert result.steps == 3 and len(result.losses) == 3
    assert all(n > 0 for n in result.requests.values()), result.requests

    nowhere = {"encoders": {"tags": ["gpu-box"]}}
    config = config_copy(tmp_path / "bad.toml", "train.toml", {"train": {"dataset": str(dataset)}, **nowhere})
    with pytest.raises(ConfigError, match=r"encoders: no node has tags \['gpu-box'\]"):
        anyio.run(lambda: run_training(config, tmp_path / "out2", steps=3, master=master.endpoint))
