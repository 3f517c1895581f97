"""``troupe bench recovery``: how fast a node notices, kills and replaces a failed worker.

Figures (medians over ``repeat`` rounds, each against a floor measured in the same run):

- ``kill_detect_s``: SIGKILL a worker -> the node's exit listener runs (``waitpid``). Floor: 0.
- ``hang_kill_s``: a ``hang_with_gil`` fault fires (the trigger message is sent) -> the node
  reaps the worker the supervisor killed. Bound: ``heartbeat_timeout_s + heartbeat_interval_s``
  (DESIGN.md invariant 5); it can come in under the timeout by up to one beat, since silence
  counts from the last beat before the hang.
- ``restart_serving_s``: SIGKILL a worker -> its restarted actor answers an ask. Floor:
  ``spawn_floor_s``, a bare Python process that imports the same modules (troupe.runtime, zmq,
  msgpack, numpy) and answers one message; the rest is troupe's restart overhead.
- ``torch_restart_serving_s``: the same for a worker whose actor module imports torch, forked
  from the node's template (``fast_start``, the default); ``torch_restart_serving_spawn_s``:
  with ``fast_start = false``, a fresh interpreter that imports torch again. Against
  ``spawn_floor_s`` (``torch_restart_over_floor``) and ``torch_spawn_floor_s`` (the bare
  process importing torch too).

The node runs inside this process (its workers and supervisor are real processes), so exits
are timed by a ``worker_exit_listeners`` hook, not by polling.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import zmq

from troupe.runtime.core.client import connect
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.config import (
    ActorSpec,
    NodeConfig,
    RestartConfig,
    SupervisionConfig,
    WorkerSpec,
)
from troupe.runtime.node.local import start_local_node
from troupe.runtime.node.node import Node
from troupe.runtime.node.worker_handles import HandleState, WorkerHandle
from troupe.runtime.transports.loopback import free_endpoint

from .stopping import bench_folder

__all__ = ["measure_recovery", "spawn_floor"]

_WORKER = "w-echo"
_TORCH_WORKER = "w-torch"
_FLOOR_WAIT_MS = 120_000  # the floor's wait for its ping: then it ends, its benchmark gone
_FLOOR_CODE = f"""
import sys
import msgpack, numpy, zmq
import troupe.runtime
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.connect(sys.argv[1])
sock.send(b"ready")
if sock.poll({_FLOOR_WAIT_MS}):
    sock.send(sock.recv())
sock.close(linger=1000)
ctx.term()
"""


def spawn_floor(extra_imports: str = "") -> float:
    """Seconds to spawn a bare Python process that imports troupe's modules (and
    ``extra_imports``, a line of Python) and answers once."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    t0 = time.perf_counter()
    code = f"{extra_imports}\n{_FLOOR_CODE}"
    # A session of its own: a Ctrl-C at the terminal is the benchmark's (it kills this process),
    # and the floor printed the traceback of whichever import it was in. A plain Popen, not
    # bench_children's: its pre-exec hook makes a start ~6 ms slower, which the floor would
    # count; the floor ends by itself instead, its ping waited for _FLOOR_WAIT_MS at most
    # (killed outright, the benchmark had left it waiting for good).
    proc = subprocess.Popen([sys.executable, "-c", code, f"tcp://127.0.0.1:{port}"], start_new_session=True)
    try:
        if not sock.poll(60_000):
            raise RuntimeError("the floor process did not start within 60 s")
        ident, _ = sock.recv_multipart()
        sock.send_multipart([ident, b"ping"])
        if not sock.poll(60_000):
            raise RuntimeError("the floor process did not answer within 60 s")
        sock.recv_multipart()
        return time.perf_counter() - t0
    except BaseException:  # stopped (Ctrl-C) or failed: it would wait for its ping for good
        proc.kill()
        raise
    finally:
        proc.wait(timeout=30)
        sock.close(0)
        ctx.term()


class _Exits:
    """Times every worker exit the node reports, from its exit listener."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.event = anyio.Event()

    def __call__(self, handle: WorkerHandle, reason: str) -> None:
        if handle.pid:
            self.at[handle.pid] = time.perf_counter()
        self.event.set()

    async def wait(self, pid: int) -> float:
        while pid not in self.at:
            self.event = anyio.Event()
            await self.event.wait()
        return self.at[pid]


async def _running(handle: WorkerHandle, old_pid: int) -> None:
    while not (handle.state is HandleState.RUNNING and handle.pid != old_pid):
        await anyio.sleep(0.001)  # a tight poll of in-process state; the caller bounds it


async def _watched(node: Node, pid: int) -> None:
    """Wait until the supervisor has a beat from ``pid``, so a hang is judged from its beats."""
    while True:
        info = await node.supervision.describe()
        watched = (info.get("supervisor") or {}).get("workers", {}).get(_WORKER)
        if watched is not None and watched["pid"] == pid and watched["last_beat_age_s"] is not None:
            return
        await anyio.sleep(0.005)


async def _serves(endpoint: str, node_name: str, worker: str = _WORKER) -> float:
    """Ask the restarted actor until it answers; returns the time of the answer."""
    async with connect(endpoint, node_name) as rt:
        while True:
            try:
                await rt.ref(f"{worker}/echo").ask("echo", 1, timeout=0.5)
                return time.perf_counter()
            except Exception:  # not registered yet, or a stale route: resolve afresh and retry
                await anyio.sleep(0.001)


async def _rounds(cfg: NodeConfig, repeat: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"kill_detect_s": [], "hang_kill_s": [], "restart_serving_s": []}
    exits = _Exits()
    async with anyio.create_task_group() as tg:
        node: Node = await start_local_node(tg, cfg)
        node.worker_exit_listeners.append(exits)
        handle = node.workers[_WORKER]
        assert node.runtime is not None
        with anyio.fail_after(60 * repeat):
            for _ in range(repeat):
                await _running(handle, 0)
                pid = handle.pid or 0
                t0 = time.perf_counter()
                os.kill(pid, signal.SIGKILL)
                out["kill_detect_s"].append(await exits.wait(pid) - t0)
                await _running(handle, pid)
                out["restart_serving_s"].append(await _serves(cfg.endpoint, cfg.name) - t0)

                pid = handle.pid or 0
                await _watched(node, pid)
                await node.supervision.chaos.inject(
                    {"kind": "hang_with_gil", "target": _WORKER, "seconds": 60}
                )
                async with connect(cfg.endpoint, cfg.name) as rt:  # open: closing drops an unsent tell
                    t0 = time.perf_counter()
                    await rt.ref(f"{_WORKER}/echo").tell("echo", "freeze")
                    out["hang_kill_s"].append(await exits.wait(pid) - t0)
            out["torch_restart_serving_s"] = await _torch_restarts(node, cfg, repeat)
        node.stopping.set()
    return out


async def _torch_restarts(node: Node, cfg: NodeConfig, repeat: int) -> list[float]:
    """SIGKILL the torch-importing worker ``repeat`` times, timing each kill -> serving."""
    handle = node.workers[_TORCH_WORKER]
    out = []
    for _ in range(repeat):
        await _running(handle, 0)
        pid = handle.pid or 0
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        await _running(handle, pid)
        out.append(await _serves(cfg.endpoint, cfg.name, _TORCH_WORKER) - t0)
    return out


async def _torch_spawn_rounds(cfg: NodeConfig, repeat: int) -> list[float]:
    """The torch worker's restarts on a node without a template (``fast_start = false``)."""
    async with anyio.create_task_group() as tg:
        node: Node = await start_local_node(tg, cfg)
        with anyio.fail_after(60 * repeat):
            out = await _torch_restarts(node, cfg, repeat)
        node.stopping.set()
    return out


def measure_recovery(
    interval_s: float = 0.1, timeout_s: float = 0.6, repeat: int = 3, progress: Any = None
) -> dict[str, Any]:
    """Run every recovery measurement and return one flat dict of figures.

    Args:
        interval_s: the heartbeat interval of the bench node.
        timeout_s: its heartbeat timeout.
        repeat: rounds of each measurement (the figures are medians).
        progress: called with a short description before each step.
    """
    say = progress or (lambda _msg: None)
    say("spawn floor (bare process importing troupe.runtime, zmq, msgpack, numpy)")
    floors = [spawn_floor() for _ in range(repeat)]
    say("spawn floor importing torch too")
    torch_floors = [spawn_floor("import torch") for _ in range(repeat)]
    with bench_folder("troupe-bench-") as tmp:
        # The kills are on purpose: only errors would be news.
        configure_logging("bench", "bench", None, console=False, level="error")
        torch_worker = WorkerSpec(
            name=_TORCH_WORKER,
            actors=(ActorSpec(name="echo", cls="troupe.actors.bench.torch_echo:TorchEcho"),),
        )
        cfg = NodeConfig(
            name="bench",
            endpoint=free_endpoint(),
            log_dir=Path(tmp),
            log_level="warning",
            workers=(
                WorkerSpec(
                    name=_WORKER, actors=(ActorSpec(name="echo", cls="troupe.actors.demo.actors:Echo"),)
                ),
                torch_worker,
            ),
            supervision=SupervisionConfig(interval_s=interval_s, heartbeat_timeout_s=timeout_s),
            restart=RestartConfig(max_restarts=10 * repeat + 10, backoff_base_s=0.0, backoff_max_s=0.0),
        )
        say(f"kill -> detect, kill -> serving, hang -> kill, torch kill -> serving ({repeat} rounds)")
        uv = {"use_uvloop": True}
        rounds = anyio.run(_rounds, cfg, repeat, backend="asyncio", backend_options=uv)
        say(f"torch kill -> serving without the template ({repeat} rounds)")
        spawn_cfg = cfg.model_copy(
            update={"endpoint": free_endpoint(), "workers": (torch_worker,), "fast_start": False}
        )
        rounds["torch_restart_serving_spawn_s"] = anyio.run(
            _torch_spawn_rounds, spawn_cfg, repeat, backend="asyncio", backend_options=uv
        )
    fig: dict[str, Any] = {
        "heartbeat_interval_s": interval_s,
        "heartbeat_timeout_s": timeout_s,
        "hang_kill_bound_s": timeout_s + interval_s,
        "restart_backoff_s": 0.0,
        "spawn_floor_s": statistics.median(floors),
        "torch_spawn_floor_s": statistics.median(torch_floors),
        "repeat": repeat,
    }
    for key, values in rounds.items():
        fig[key] = statistics.median(values)
        fig[f"{key.removesuffix('_s')}_all_s"] = [round(v, 4) for v in values]
    fig["restart_serving_over_floor"] = fig["restart_serving_s"] / fig["spawn_floor_s"]
    fig["torch_restart_over_floor"] = fig["torch_restart_serving_s"] / fig["spawn_floor_s"]
    return fig
