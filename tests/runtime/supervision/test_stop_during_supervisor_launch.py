"""A node told to stop while its supervisor was being started left that supervisor running: stop()
found no process yet and returned, and the one that started next lived on until its wait for
the node's answer ran out (about 10 s; a run stopped as it started, in a program's process).
stop() now waits for a launch under way, and stops what it started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import psutil
import pytest

import troupe.runtime.supervision.node_side as node_side
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.supervision.node_side import NodeSupervision

BOUND_S = 60.0  # against a hang only


@pytest.mark.anyio
async def test_a_supervisor_started_as_the_node_stops_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, go = anyio.Event(), anyio.Event()
    procs: list[Any] = []

    async def start_child(_template: Any, main: str, env: dict[str, str], *_: Any) -> tuple[Any, str]:
        started.set()
        await go.wait()  # the fork is under way when the stop comes
        proc = await anyio.open_process(
            [sys.executable, "-c", "import time; time.sleep(120)"], stdout=subprocess.DEVNULL
        )
        procs.append(proc)
        return proc, "spawn"

    monkeypatch.setattr(node_side, "start_child", start_child)
    cfg = NodeConfig(name="n", endpoint="tcp://127.0.0.1:41591", log_dir=tmp_path, stop_grace_s=2.0)
    node: Any = SimpleNamespace(
        name="n", config=cfg, runtime=None, template=None, children=SimpleNamespace(add=lambda *_: None)
    )
    supervision = NodeSupervision(node)
    try:
        with anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(supervision._launch_supervisor)
                await started.wait()
                tg.start_soon(supervision.stop)
                await anyio.wait_all_tasks_blocked()  # the stop is waiting for the launch
                go.set()
        assert procs and procs[0].returncode is not None, "the supervisor outlived its node's stop"
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert not psutil.pid_exists(procs[0].pid) or psutil.Process(procs[0].pid).status() == "zombie"
