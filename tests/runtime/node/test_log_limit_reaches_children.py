"""A node's workers and its supervisor are launched with its log file's size and keep: each rotates
the file itself before a line that would take it past (log_files), not the node alone (report ob 3)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import troupe.runtime.node.worker_handles as worker_handles
import troupe.runtime.supervision.node_side as node_side
from troupe.runtime.node.config import NodeConfig, WorkerSpec
from troupe.runtime.node.worker_handles import WorkerHandle, launch_worker
from troupe.runtime.node.worker_process import SPEC_ENV as WORKER_SPEC_ENV
from troupe.runtime.node.worker_process import WorkerLaunch
from troupe.runtime.supervision.node_side import NodeSupervision
from troupe.runtime.supervision.supervisor import SPEC_ENV as SUPERVISOR_SPEC_ENV
from troupe.runtime.supervision.supervisor import SupervisorLaunch

ENDPOINT = "tcp://127.0.0.1:41590"  # never bound: nothing is started


def _config(tmp_path: Path) -> NodeConfig:
    return NodeConfig(
        name="n",
        endpoint=ENDPOINT,
        log_dir=tmp_path,
        log_max_mb=0.5,
        log_keep=7,
        workers=(WorkerSpec(name="w1"),),
    )


def _started(monkeypatch: pytest.MonkeyPatch, module: Any) -> dict[str, dict[str, str]]:
    """The environment each child would have been started with, by kind; no process is started."""
    envs: dict[str, dict[str, str]] = {}

    async def start_child(_template: Any, main: str, env: dict[str, str], *_: Any) -> tuple[Any, str]:
        envs[main] = env
        return SimpleNamespace(pid=1 << 22, returncode=None), "spawn"

    monkeypatch.setattr(module, "start_child", start_child)
    return envs


@pytest.mark.anyio
async def test_a_worker_is_launched_with_the_node_s_log_size_and_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tmp_path)
    envs = _started(monkeypatch, worker_handles)
    await launch_worker(WorkerHandle(cfg.workers[0]), "n", ENDPOINT, cfg, None)
    launch = WorkerLaunch.model_validate(json.loads(envs["worker"][WORKER_SPEC_ENV]))
    assert (launch.log_max_bytes, launch.log_keep) == (512 * 1024, 7)


@pytest.mark.anyio
async def test_the_supervisor_is_launched_with_the_node_s_log_size_and_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tmp_path)
    envs = _started(monkeypatch, node_side)
    node: Any = SimpleNamespace(
        name="n", config=cfg, runtime=None, template=None, children=SimpleNamespace(add=lambda *_: None)
    )
    await NodeSupervision(node)._launch_supervisor()
    launch = SupervisorLaunch.model_validate(json.loads(envs["supervisor"][SUPERVISOR_SPEC_ENV]))
    assert (launch.log_max_bytes, launch.log_keep) == (512 * 1024, 7)
