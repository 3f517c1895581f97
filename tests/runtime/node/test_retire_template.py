"""``Node.retire_template``: a run whose items have all ended stops its node's template early.

A real node (in this process) with its template. What a user relies on: the template goes (and
is reaped), and the node still starts a worker asked of it afterwards, spawned."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import psutil
import pytest

from support.local_node import ECHO, echo_node_config, running_node
from troupe.runtime.core.client import connect
from troupe.runtime.testing.plugin import import_path

WITHIN_S = 60.0  # a bound on a stop or a start on a loaded machine, not on speed


async def test_a_retired_template_is_reaped_and_workers_still_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())
    cfg = echo_node_config(tmp_path, "rt")
    async with running_node(cfg) as node:
        assert node.template is not None
        template = node.template.describe()["pid"]
        assert template is not None
        node.retire_template()
        with anyio.fail_after(WITHIN_S):  # reaped by the node's loop, which this poll leaves run
            while psutil.pid_exists(template):
                await anyio.sleep(0.01)
        assert node.runtime is not None
        later = {"name": "later", "actors": [ECHO.model_dump(by_alias=True)]}
        await node.runtime.control(node.runtime.address, "spawn_worker", later, timeout=WITHIN_S)
        assert node.workers["later"].start_mode == "spawn"
        async with connect(cfg.endpoint, cfg.name) as rt:
            assert await rt.ref("later/echo").ask("echo", os.getpid(), timeout=30) == os.getpid()
