"""Fast start: a node forks its workers from a template process that has done their imports.

Real nodes (in this process), templates and workers on loopback. What a user relies on: a
forked worker is what a spawned one was (it serves, it is the node's own child, its stderr's
last error reaches the node, it is restarted the same way, it goes when the node stops), and
the template is a shortcut only: when it dies, workers keep running and still start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import anyio
import psutil
import pytest
from structlog.testing import capture_logs

from support.local_node import ECHO, echo_node_config, running_node
from troupe.runtime.core.client import connect
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import ActorSpec, NodeConfig, WorkerSpec
from troupe.runtime.node.node import Node
from troupe.runtime.node.worker_handles import HandleState, WorkerHandle
from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import Cluster

GC_PROBE = ActorSpec(name="gc", cls="support.gc_probe:GcProbe")
TESTS_DIR = Path(__file__).resolve().parents[2]
# The plugin's fixture, also when the `troupe` pytest11 entry point is not installed.
troupe_cluster = troupe_testing.troupe_cluster
GONE_WITHIN_S = 15.0  # a bound on a poll of the process table, not on speed


def _config(tmp_path: Path, **extra: object) -> NodeConfig:
    return echo_node_config(tmp_path, "fs", **extra)


def _node(cfg: NodeConfig) -> AbstractAsyncContextManager[Node]:
    """A node in this process; stopped (workers and template reaped) on the way out."""
    return running_node(cfg)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


async def _wait_gone(pids: set[int]) -> set[int]:
    deadline = time.monotonic() + GONE_WITHIN_S
    left = set(pids)
    while left and time.monotonic() < deadline:
        left = {pid for pid in left if not _gone(pid)}
        await anyio.sleep(0.05)
    return left


async def _running_again(handle: WorkerHandle, old_pid: int) -> None:
    with anyio.fail_after(60):
        while not (handle.state is HandleState.RUNNING and handle.pid not in (None, old_pid)):
            await anyio.sleep(0.01)  # a bounded poll of in-process state


async def _echo(cfg: NodeConfig, worker: str, value: object) -> object:
    async with connect(cfg.endpoint, cfg.name) as rt:
        return await rt.ref(f"{worker}/echo").ask("echo", value, timeout=30)


async def test_workers_are_forked_from_the_template_serve_and_are_the_nodes_children(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    async with _node(cfg) as node:
        handle = node.workers["w1"]
        assert node.template is not None and node.template.pid is not None
        assert handle.describe()["start"] == "fork"
        assert handle.pid is not None and handle.pid != node.template.pid
        # Adopted by the node: waited for, signalled and outlived like a spawned worker.
        assert psutil.Process(handle.pid).ppid() == os.getpid()
        assert await _echo(cfg, "w1", {"x": 1}) == {"x": 1}
        status = await node._status(None)
        assert status["template"]["forks"] >= 1


async def test_a_killed_forked_worker_is_restarted_through_the_template(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    async with _node(cfg) as node:
        handle = node.workers["w1"]
        assert node.template is not None
        forks, old = node.template.forks, handle.pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        await _running_again(handle, old)
        assert handle.exit_reason.startswith("killed by SIGKILL (not by troupe")  # the test's own kill
        assert handle.describe()["start"] == "fork" and node.template.forks == forks + 1
        assert await _echo(cfg, "w1", "again") == "again"


async def test_a_forked_worker_that_fails_to_start_reports_its_error(tmp_path: Path) -> None:
    """Its stderr reaches the node: the spawn_worker error names the cause, as for a spawned one."""
    cfg = _config(tmp_path)
    async with _node(cfg) as node:
        bad = {
            "name": "w-bad",
            "actors": [{"name": "a", "class": "no_such_module_fs:Thing"}],
            "timeout_s": 60,
        }
        with pytest.raises(ConfigError, match="No module named 'no_such_module_fs'"):
            await node._spawn_worker(bad)
        handle = node.workers["w-bad"]
        assert handle.describe()["start"] == "fork"
        assert "No module named 'no_such_module_fs'" in (handle.last_error or "")


async def test_a_worker_started_from_another_cwd_is_spawned_and_the_refusal_names_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template's imports were made from the node's cwd: a worker asked for from another one
    is refused by the template (logged with the node's name) and spawned instead, and serves."""
    cfg = _config(tmp_path)
    async with _node(cfg) as node:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        monkeypatch.chdir(elsewhere)
        with capture_logs() as logs:
            await node._spawn_worker({"name": "w-moved", "actors": [{"name": "echo", "class": ECHO.cls}]})
        refused = [e for e in logs if e["event"] == "template_fork_refused"]
        assert refused and refused[0]["node"] == cfg.name
        assert "cwd or PYTHONPATH differs" in refused[0]["error"]
        assert node.workers["w-moved"].describe()["start"] == "spawn"
        assert await _echo(cfg, "w-moved", "here") == "here"


async def test_the_nodes_stop_leaves_no_worker_and_no_template(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path, workers=(WorkerSpec(name="w1", actors=(ECHO,)), WorkerSpec(name="w2", actors=(ECHO,)))
    )
    async with _node(cfg) as node:
        assert node.template is not None and node.template.pid is not None
        pids = {h.pid for h in node.workers.values() if h.pid} | {node.template.pid}
        assert len(pids) == 3
    assert all(h.returncode == 0 for h in node.workers.values())  # stopped gracefully, reaped
    assert not await _wait_gone(pids)


async def test_when_the_template_dies_workers_keep_running_and_still_start(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    async with _node(cfg) as node:
        assert node.template is not None and node.template.pid is not None
        template_pid = node.template.pid
        os.kill(template_pid, signal.SIGKILL)
        assert not await _wait_gone({template_pid})
        assert await _echo(cfg, "w1", 1) == 1  # not the template's child: it stays

        info = await node._spawn_worker({"name": "w-later", "actors": [ECHO.model_dump(by_alias=True)]})
        assert info["state"] == "running" and info["start"] in ("fork", "spawn")
        assert await _echo(cfg, "w-later", 2) == 2

        with anyio.fail_after(60):  # a new template replaces it
            while not (node.template.describe()["ready"] and node.template.pid != template_pid):
                await anyio.sleep(0.02)
        old = node.workers["w1"].pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        await _running_again(node.workers["w1"], old)
        assert node.workers["w1"].describe()["start"] == "fork"


async def test_fast_start_off_spawns_every_worker(tmp_path: Path) -> None:
    cfg = _config(tmp_path, fast_start=False)
    async with _node(cfg) as node:
        assert node.template is None
        handle = node.workers["w1"]
        assert handle.describe()["start"] == "spawn"
        assert await _echo(cfg, "w1", "spawned") == "spawned"


@pytest.mark.parametrize("fast_start", [True, False], ids=["forked", "spawned"])
async def test_a_worker_collects_its_own_garbage_and_leaves_the_templates_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast_start: bool
) -> None:
    """The template imports with the collector off and freezes what it made: a forked worker
    collects (its own objects) and never scans the template's; a spawned one has nothing frozen."""
    path = os.pathsep.join(filter(None, (str(TESTS_DIR), os.environ.get("PYTHONPATH"))))
    monkeypatch.setenv("PYTHONPATH", path)
    workers = (WorkerSpec(name="w1", actors=(GC_PROBE,)),)
    cfg = _config(tmp_path, fast_start=fast_start, workers=workers)
    async with _node(cfg) as node, connect(cfg.endpoint, cfg.name) as rt:
        assert node.workers["w1"].describe()["start"] == ("fork" if fast_start else "spawn")
        state = await rt.ref("w1/gc").ask("state", None, timeout=30)
    assert state["enabled"] is True
    if fast_start:
        assert state["frozen"] > 10_000  # the worker runtime's modules, imported by the template
    else:
        assert state["frozen"] == 0


def test_the_template_imports_what_a_class_names_in_preload_modules() -> None:
    """A class that imports torch lazily names it; the template imports it ahead (in a process of its own
    here, as the template is); a class that does not import is skipped with its error."""
    code = (
        "import json, sys\n"
        "from troupe.runtime.node.template_preload import preload\n"
        "told = []\n"
        "names = ['troupe.actors.datagen.lifecycle:RaycastRenderer', 'no_such_fs:X']\n"
        "print(json.dumps([*preload(names, told.append), told]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    imported, skipped, told = json.loads(out.stdout)
    assert {"troupe.actors.datagen.lifecycle", "torch", "troupe.actors.datagen.render"} <= set(imported)
    assert skipped == {"no_such_fs:X": "ModuleNotFoundError: No module named 'no_such_fs'"}
    # Each named before its import, the node's waiting run shows the one that takes long.
    assert told == [
        "troupe.actors.datagen.lifecycle:RaycastRenderer",
        "torch",
        "troupe.actors.datagen.render",
        "no_such_fs:X",
    ]


def test_a_preloaded_module_brings_what_its_classes_name_in_preload_modules() -> None:
    """A node's ``preload`` naming the actors' module, not each class: the template imports what
    the module's classes import lazily too (a render replica imported torch as it started,
    0.8 s, on a node whose config named only the module)."""
    code = (
        "import json\n"
        "from troupe.runtime.node.template_preload import preload\n"
        "print(json.dumps(preload(['troupe.actors.datagen.lifecycle'])))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    imported, skipped = json.loads(out.stdout)
    assert {"troupe.actors.datagen.lifecycle", "torch", "troupe.actors.datagen.render"} <= set(imported)
    assert skipped == {}
    assert len(imported) == len(set(imported))  # each once, however many classes name it


TWO_WORKERS = """
[node]
stop_grace_s = 2

[[workers]]
name = "w1"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]

[[workers]]
name = "w2"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]
"""


async def test_a_sigkilled_node_takes_its_forked_workers_and_its_template_with_it(
    troupe_cluster: Callable[..., Cluster],
) -> None:
    cluster = troupe_cluster(TWO_WORKERS)
    status = await cluster.status()
    assert {w["start"] for w in status["workers"]} == {"fork"}
    workers = {w["pid"] for w in status["workers"]}
    template = status["template"]["pid"]
    children = {p.pid: p for p in cluster.descendants()}
    assert workers | {template} <= set(children)
    assert all(children[pid].ppid() == cluster.proc.pid for pid in workers)  # the node's own

    cluster.proc.send_signal(signal.SIGKILL)
    cluster.proc.wait(timeout=30)

    assert not await _wait_gone(set(children)), "outlived their SIGKILLed node"
