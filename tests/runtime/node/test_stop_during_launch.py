"""A worker whose launch is under way when its node stops (a restart the node's supervision
began a moment before) is stopped with the node, not left running: the node's stop looked only
at workers with a process, and one whose launch ended after its last look outlived the node
(CI: a replica's restart whose template fork was refused as the template stopped, spawned 3 ms
before `node_stopped`). The restart's launch is held here until the node's stop has begun."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from support.local_node import echo_node_config
from troupe.runtime.node import worker_lifecycle
from troupe.runtime.node.local import start_local_node

BOUND_S = 60.0  # against a hang only


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def test_a_launch_under_way_when_the_node_stops_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_launch = worker_lifecycle.launch_worker
    held, go = anyio.Event(), anyio.Event()
    launched: list[int] = []
    calls = 0

    async def restart_held_until_the_stop(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            return await real_launch(*args, **kwargs)
        with anyio.CancelScope(shield=True):  # as a launch past its point of no return
            held.set()
            await go.wait()
            proc = await real_launch(*args, **kwargs)
        launched.append(proc.pid)
        return proc

    monkeypatch.setattr(worker_lifecycle, "launch_worker", restart_held_until_the_stop)
    cfg = echo_node_config(tmp_path, "stoprace")
    with anyio.fail_after(BOUND_S):
        async with anyio.create_task_group() as tg:
            node = await start_local_node(tg, cfg)
            real_stop = node.supervision.stop

            async def stop_then_let_the_launch_end() -> None:  # the node's stop has begun
                go.set()
                await real_stop()

            monkeypatch.setattr(node.supervision, "stop", stop_then_let_the_launch_end)
            first = node.workers["w1"].pid
            assert first is not None
            os.kill(first, signal.SIGKILL)  # the node restarts it: that launch is held
            await held.wait()
            node.stopping.set()
            await node.stopped.wait()
    assert len(launched) == 1, launched
    assert not _alive(launched[0]), f"worker {launched[0]} outlived its node"
