"""A worker (re)start whose process cannot be started (the fork refused: a process limit reached,
EAGAIN) is a failed start of that worker, under the node's restart policy: the node and its
other workers stay up. The failure ended the node whole, with a hundred-line traceback, and
took its healthy workers with it (report rs 7: a cgroup's pids.max reached as one worker
restarted). The launches are refused here by a fake; no limit is set."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from support.local_node import ECHO, echo_node_config, running_node
from support.memory_master import until
from support.port_range import test_endpoint
from troupe.runtime.node import worker_lifecycle
from troupe.runtime.node.config import WorkerSpec
from troupe.runtime.node.worker_handles import START_FAILED, HandleState
from troupe.runtime.supervision import node_side

WAIT_S = 60.0  # a bound on a worker's start on a loaded machine, not on speed
REFUSED = "could not start a process: Resource temporarily unavailable (a process limit: ulimit -u"


def _refusing(refusals: list[int]) -> Any:
    """``launch_worker`` that raises EAGAIN for the next ``refusals[0]`` launches, then launches."""
    real_launch = worker_lifecycle.launch_worker

    async def launch(*args: Any, **kwargs: Any) -> Any:
        if refusals[0] > 0:
            refusals[0] -= 1
            args[0].incarnation += 1  # as the real one does before its fork
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return await real_launch(*args, **kwargs)

    return launch


def _config(tmp_path: Path, name: str) -> Any:
    workers = (WorkerSpec(name="w1", actors=(ECHO,)), WorkerSpec(name="w2", actors=(ECHO,)))
    return echo_node_config(tmp_path, name, endpoint=test_endpoint(), workers=workers)


async def test_a_refused_restart_is_retried_and_the_other_worker_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusals = [0]
    monkeypatch.setattr(worker_lifecycle, "launch_worker", _refusing(refusals))
    async with running_node(_config(tmp_path, "refused")) as node:
        w1, w2 = node.workers["w1"], node.workers["w2"]
        await until(lambda: w1.state is HandleState.RUNNING and w2.state is HandleState.RUNNING, WAIT_S)
        first, healthy = w1.pid, w2.pid
        assert first is not None and healthy is not None
        refusals[0] = 1  # the limit is reached for one start: the next restart starts it
        os.kill(first, signal.SIGKILL)
        await until(lambda: w1.state is HandleState.RUNNING and w1.pid not in (None, first), WAIT_S)
        assert w1.restarts == 2 and refusals == [0]  # the kill's restart, refused; then the next
        assert w1.last_error is not None and w1.last_error.startswith(REFUSED), w1.last_error
        assert not node.stopping.is_set()
        assert w2.pid == healthy and w2.state is HandleState.RUNNING
        os.kill(healthy, 0)  # still running


async def test_a_worker_never_startable_is_failed_and_the_node_stays_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusals = [0]
    monkeypatch.setattr(worker_lifecycle, "launch_worker", _refusing(refusals))
    async with running_node(_config(tmp_path, "refused2")) as node:
        w1, w2 = node.workers["w1"], node.workers["w2"]
        await until(lambda: w1.state is HandleState.RUNNING and w2.state is HandleState.RUNNING, WAIT_S)
        refusals[0] = 1000  # for good
        assert w1.pid is not None
        os.kill(w1.pid, signal.SIGKILL)
        await until(lambda: w1.state is HandleState.FAILED, WAIT_S)  # after max_restarts
        assert w1.exit_reason == START_FAILED
        assert not node.stopping.is_set() and w2.state is HandleState.RUNNING


async def test_a_refused_supervisor_start_is_retried_under_its_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start = node_side.start_child
    refused: list[str] = []

    async def refuse_the_first_supervisor(template: Any, main: str, *args: Any) -> Any:
        if main == "supervisor" and not refused:
            refused.append(main)
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return await real_start(template, main, *args)

    monkeypatch.setattr(node_side, "start_child", refuse_the_first_supervisor)
    async with running_node(_config(tmp_path, "refused3")) as node:
        await until(lambda: node.supervision.endpoint is not None, WAIT_S)
        assert refused == ["supervisor"]
        assert node.supervision.starts == 1 and not node.supervision.failed
        assert not node.stopping.is_set()
