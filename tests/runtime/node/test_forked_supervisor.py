"""The supervisor forked from a ready template: what a one-host run's node starts.

Real nodes (in this process), templates, supervisors and workers on loopback. What a user
relies on: a forked supervisor is what a spawned one was (the node's own child, it registers,
watches every worker, is restarted when it dies and goes when the node stops), and a template
that is not ready yet never delays it: the node spawns it then, as before.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import psutil

from support.local_node import ECHO, echo_node_config, ready_template, running_node
from troupe.runtime.node.child import child_env
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.node.node import Node
from troupe.runtime.node.template_link import TemplateLink

WITHIN_S = 60.0  # a bound on a start or a stop on a loaded machine, not on speed


def _config(tmp_path: Path, **extra: object) -> NodeConfig:
    return echo_node_config(tmp_path, "fsup", **extra)


def _ready_template(modules: list[str]) -> AbstractAsyncContextManager[TemplateLink]:
    """A template started and ready before any node, as a one-host run starts its own."""
    return ready_template(TemplateLink("fsup", modules))


async def _watching(node: Node, old_pid: int | None = None) -> dict[str, Any]:
    """The node's supervision once a supervisor (not ``old_pid``) watches every worker."""
    with anyio.fail_after(WITHIN_S):
        while True:
            info = await node.supervision.describe()
            watched = (info.get("supervisor") or {}).get("workers", {})
            if info["supervisor_pid"] not in (None, old_pid) and all(
                h.pid is not None and watched.get(name, {}).get("pid") == h.pid
                for name, h in node.workers.items()
            ):
                return info
            await anyio.sleep(0.02)  # a bounded poll of the node's own status


async def _gone(pid: int) -> bool:
    deadline = time.monotonic() + WITHIN_S
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        await anyio.sleep(0.05)  # a bounded poll of the process table
    return False


async def test_a_node_given_a_ready_template_forks_its_supervisor_which_watches_its_workers(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path)
    async with _ready_template([ECHO.cls]) as template:
        async with running_node(cfg, template) as node:
            info = await _watching(node)
            pid = info["supervisor_pid"]
            assert info["supervisor_start"] == "fork" and info["supervisor_starts"] == 1
            assert template.forks == 2  # the worker and the supervisor
            assert psutil.Process(pid).ppid() == os.getpid()  # the node's own child
            assert info["supervisor"]["pid"] == pid
        assert await _gone(pid), "the forked supervisor outlived its node's stop"


async def test_a_killed_forked_supervisor_is_forked_again_and_watches_every_worker(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path)
    async with _ready_template([ECHO.cls]) as template, running_node(cfg, template) as node:
        old = (await _watching(node))["supervisor_pid"]
        os.kill(old, signal.SIGKILL)
        info = await _watching(node, old_pid=old)
        assert info["supervisor_start"] == "fork" and info["supervisor_starts"] == 2


async def test_without_a_template_the_supervisor_is_spawned(tmp_path: Path) -> None:
    cfg = _config(tmp_path, fast_start=False)
    async with running_node(cfg, None) as node:
        info = await _watching(node)
        assert info["supervisor_start"] == "spawn"


async def test_a_template_not_ready_yet_refuses_the_supervisor_at_once() -> None:
    """A worker's launch waits for the first template's imports; the supervisor's does not: it
    is spawned meanwhile, importing on another core, rather than wait for torch's import."""
    link = TemplateLink("fsup", [])  # never started: never ready
    with anyio.fail_after(5):  # far below the minutes a worker's launch would wait
        assert await link.launch(child_env({}), (), main="supervisor") is None


async def test_the_template_refuses_a_main_it_does_not_know_and_still_forks_workers(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path)
    async with _ready_template([ECHO.cls]) as template:
        assert await template.launch(child_env({}), (), main="/bin/sh") is None
        assert template.describe()["ready"] and template.forks == 0
        async with running_node(cfg, template) as node:
            assert node.workers["w1"].describe()["start"] == "fork"
