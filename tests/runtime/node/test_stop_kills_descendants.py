"""A worker the node stops on purpose takes the processes it started with it.

A stage's helper (a ``sleep`` through ``subprocess``) and a forked child that ignores SIGTERM
outlived their worker's graceful stop, reparented, holding what the worker gave them (the
pipes of the command that started the run: ``troupe run ... | tail`` never returned). Now
both are gone once the stop is over: a ``stop_worker``, and the node's own stop. Real node and
workers in this process, on loopback.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import psutil
import pytest

from support.local_node import running_node
from troupe.runtime.core.client import connect
from troupe.runtime.node.config import ActorSpec, NodeConfig, WorkerSpec
from troupe.runtime.node.worker_descendants import descendants_of
from troupe.runtime.testing.plugin import free_endpoint

TESTS_DIR = Path(__file__).resolve().parents[2]
Taken = list[psutil.Process]
MAKER = ActorSpec(name="maker", cls="support.descendant_maker:DescendantMaker")
BOUND_S = 60  # a bound on a hang, never on speed


@pytest.fixture(autouse=True)
def workers_import_the_test_actors(monkeypatch: pytest.MonkeyPatch) -> None:
    path = os.pathsep.join(filter(None, (str(TESTS_DIR), os.environ.get("PYTHONPATH"))))
    monkeypatch.setenv("PYTHONPATH", path)


@pytest.fixture
def children() -> Iterator[list[psutil.Process]]:
    """The worker's children, as the test took them; killed at the end whatever the test found
    (each as it was taken: psutil does not signal a pid reused since)."""
    taken: list[psutil.Process] = []
    yield taken
    for proc in taken:
        if _running(proc):
            proc.kill()


def _config(tmp_path: Path) -> NodeConfig:
    return NodeConfig(
        name="desc",
        endpoint=free_endpoint(),
        log_dir=tmp_path,
        log_level="warning",
        stop_grace_s=5.0,
        workers=(WorkerSpec(name="w1", actors=(MAKER,)),),
    )


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def _start_children(cfg: NodeConfig, into: list[psutil.Process]) -> None:
    async with connect(cfg.endpoint, cfg.name) as rt:
        pids = await rt.ref("w1/maker").ask("start", None, timeout=BOUND_S)
    into.extend(psutil.Process(pid) for pid in pids)
    assert len(into) == 2 and all(_running(p) for p in into)


async def test_stop_worker_kills_what_the_worker_started(tmp_path: Path, children: Taken) -> None:
    cfg = _config(tmp_path)
    async with running_node(cfg) as node:
        assert node.runtime is not None
        await _start_children(cfg, children)
        with anyio.fail_after(BOUND_S):
            assert await node.runtime.control(node.runtime.address, "stop_worker", {"name": "w1"}) is True
        assert node.workers["w1"].returncode is not None
        assert [p.pid for p in children if _running(p)] == []


async def test_the_nodes_stop_kills_what_its_workers_started(tmp_path: Path, children: Taken) -> None:
    cfg = _config(tmp_path)
    async with running_node(cfg):
        await _start_children(cfg, children)
    assert [p.pid for p in children if _running(p)] == []


def test_descendants_are_listed_parents_first() -> None:
    """The order the stop kills them in: a parent's tree kill takes its children with it."""
    shell = psutil.Popen(["/bin/sh", "-c", "sleep 60 & wait"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + BOUND_S
        while not shell.children() and time.monotonic() < deadline:
            time.sleep(0.01)  # a bounded poll for the shell's child to exist
        (sleeper,) = shell.children()
        found = [p.pid for p in descendants_of({os.getpid()})[os.getpid()]]
        assert found.index(shell.pid) < found.index(sleeper.pid)
    finally:
        for proc in shell.children():
            proc.kill()
        shell.kill()
        shell.wait(timeout=BOUND_S)


async def test_a_shell_s_background_helper_goes_with_its_worker(tmp_path: Path, children: Taken) -> None:
    """``helper &`` through a shell: orphaned at once, no longer below the worker when the stop
    took its tree; it stays in the worker's process group, and goes with it."""
    cfg = _config(tmp_path)
    async with running_node(cfg) as node:
        assert node.runtime is not None
        async with connect(cfg.endpoint, cfg.name) as rt:
            children.append(psutil.Process(await rt.ref("w1/maker").ask("background", None, timeout=BOUND_S)))
        assert _running(children[0]) and children[0].ppid() != node.workers["w1"].pid
        with anyio.fail_after(BOUND_S):
            assert await node.runtime.control(node.runtime.address, "stop_worker", {"name": "w1"}) is True
        assert [p.pid for p in children if _running(p)] == []


async def test_what_a_killed_worker_started_goes_with_it(tmp_path: Path, children: Taken) -> None:
    """A worker that died without a stop (SIGKILL, the OOM killer): nothing had taken its tree,
    and what it started ran on for good, reparented, holding the run's pipes."""
    cfg = _config(tmp_path)
    async with running_node(cfg) as node:
        await _start_children(cfg, children)
        worker = psutil.Process(node.workers["w1"].pid)
        worker.kill()
        with anyio.fail_after(BOUND_S):
            while any(_running(p) for p in children):  # a bounded poll: the node reaps, then kills
                await anyio.sleep(0.05)
        assert [p.pid for p in children if _running(p)] == []
