"""A keys directory edited under a running node: every worker loaded the directory at its own
start, so after a key was revoked the node and its old workers served it and a restarted worker
refused it, and a cluster pair staged in place left a restarted worker unable to register with
its own node, failed for good (report ak 1). Every process of a node now has the keys the node
loaded at its start; an edit takes effect at the node's restart.

A real node (in this process) with keys and one echo worker, killed after the edit."""

from __future__ import annotations

import os
import shutil
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from support.local_node import echo_node_config, running_node
from troupe.runtime.core.client import connect
from troupe.runtime.node.leftovers import keys_file
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.security.process import install
from troupe.runtime.testing.plugin import import_path

WITHIN_S = 60.0  # a bound on a restart or an answer on a loaded machine, not on speed


@pytest.fixture
def keys(tmp_path: Path) -> Iterator[Path]:
    generate_keys(tmp_path / "keys")
    generate_keys(tmp_path / "new")  # a cluster pair staged before a maintenance window
    yield tmp_path / "keys"
    install(None)  # the node installed its keys in this process


async def test_a_worker_restarted_after_a_key_edit_has_the_keys_of_its_node(
    tmp_path: Path, keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())
    cfg = echo_node_config(tmp_path, "kl", keys=keys)
    snapshot = keys_file(tmp_path, "kl", os.getpid())
    async with running_node(cfg) as node, connect(cfg.endpoint, cfg.name, keys=keys) as operator:
        echo = operator.ref("echo")
        assert await echo.ask("echo", "before", timeout=WITHIN_S) == "before"
        assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600  # it holds the cluster's secret
        (keys / "operator.key").unlink()  # revoked, and a new cluster pair staged, without a restart
        for name in ("cluster.key", "cluster.key_secret"):
            shutil.copy2(tmp_path / "new" / name, keys / name)
        worker = node.workers["w1"]
        old = worker.pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        with anyio.fail_after(WITHIN_S):  # a bounded poll of the node's state, in this process
            while worker.pid == old or not worker.ready_event.is_set():
                await anyio.sleep(0.01)
        assert worker.restarts == 1 and worker.state.value == "running", worker.describe()
        # The restarted worker registered with its node, and serves whom the node serves.
        assert await echo.ask("echo", "after", timeout=WITHIN_S) == "after"
    assert not snapshot.exists()  # removed as the node stopped
