"""What a node knows about each of its worker processes, and how it launches one."""

from __future__ import annotations

import enum
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import anyio
from anyio.abc import Process

from .config import NodeConfig, WorkerSpec

__all__ = ["WorkerHandle", "WorkerState", "exit_reason", "launch_worker"]


class WorkerState(enum.Enum):
    """Where a worker process is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    EXITED = "exited"
    FAILED = "failed"


def exit_reason(returncode: int) -> str:
    """Describe a process exit status: ``exit 0``, ``exit 3``, ``killed by SIGKILL``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


class WorkerHandle:
    """The node's record of one worker slot, across its restarts."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.state = WorkerState.STARTING
        self.process: Process | None = None
        self.pid: int | None = None
        self.endpoint: str | None = None
        self.actors: dict[str, str] = {}  # actor name -> its mailbox endpoint
        self.incarnation = 0
        self.restarts = 0
        self.returncode: int | None = None
        self.exit_reason = ""
        self.started_at = 0.0
        self.ready_event = anyio.Event()
        self.exited_event = anyio.Event()

    def launched(self, process: Process) -> None:
        """A new incarnation of the worker was started."""
        self.process = process
        self.pid = process.pid
        self.returncode = None
        self.endpoint = None
        self.state = WorkerState.STARTING
        self.started_at = time.time()
        # Replace the events only once used, so that a waiter on the first launch is not lost.
        if self.ready_event.is_set():
            self.ready_event = anyio.Event()
        if self.exited_event.is_set():
            self.exited_event = anyio.Event()

    def registered(self, endpoint: str, pid: int, actors: dict[str, str]) -> None:
        """The worker bound its mailbox and its actors have started."""
        self.endpoint = endpoint
        self.pid = pid
        self.actors = actors
        if self.state is WorkerState.STARTING:
            self.state = WorkerState.RUNNING
        self.ready_event.set()

    def exited(self, returncode: int) -> None:
        """The process was reaped with ``returncode``."""
        self.returncode = returncode
        self.exit_reason = exit_reason(returncode)
        self.state = WorkerState.STOPPED if self.state is WorkerState.STOPPING else WorkerState.EXITED
        self.endpoint = None
        self.exited_event.set()

    def describe(self) -> dict[str, Any]:
        """Plain data for status replies."""
        return {
            "name": self.spec.name,
            "kind": self.spec.kind,
            "state": self.state.value,
            "pid": self.pid,
            "endpoint": self.endpoint,
            "actors": sorted({a.name for a in self.spec.actors} | set(self.actors)),
            "actor_endpoints": dict(self.actors),
            "incarnation": self.incarnation,
            "restarts": self.restarts,
            "exit": self.exit_reason,
        }


async def launch_worker(
    handle: WorkerHandle, node: str, node_endpoint: str, cfg: NodeConfig, restart_reason: str | None,
    supervision: dict[str, Any] | None = None,
) -> Process:
    """Start the worker process of ``handle`` and record it.

    ``supervision`` adds the launch fields of supervision (``supervisor_addr``,
    ``heartbeat_interval_s``; see ``NodeSupervision.launch_options``).
    """
    handle.incarnation += 1
    spec = {
        "node": node,
        "process": handle.spec.name,
        "node_endpoint": node_endpoint,
        "actors": [a.model_dump(by_alias=True) for a in handle.spec.actors],
        "kind": handle.spec.kind,
        "incarnation": handle.incarnation,
        "restart_reason": restart_reason,
        "log_dir": str(cfg.log_dir.resolve()),
        "log_level": cfg.log_level,
        "hwm": cfg.hwm,
        "max_message_mb": cfg.max_message_mb,
        "ask_timeout_s": cfg.ask_timeout_s,
        "drain_timeout_s": cfg.drain_timeout_s,
        "master": cfg.master,  # task dispatch: the worker's TaskGetter pulls from it
        **(supervision or {}),
    }
    env = dict(os.environ, TROUPE_WORKER_SPEC=json.dumps(spec))
    process = await anyio.open_process(
        [sys.executable, "-m", "troupe.lean_start", "troupe.runtime.worker"],  # lean_start: no rich
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=None,
    )
    handle.launched(process)
    return process
