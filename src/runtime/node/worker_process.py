"""The worker process: one event loop (uvloop), one ZeroMQ mailbox, the actors it hosts.

Started by its node as ``python -P -m troupe.lean_start troupe.runtime.node.worker_process`` (lighter:
see lean_start) with its launch spec in the environment variable ``TROUPE_WORKER_SPEC`` (JSON).
It binds its mailboxes on free ports of the node's own host address (``bind``: loopback for a
loopback node, the host's address for a node other hosts reach; see reach.py), starts its
actors, registers with the node, and serves until SIGTERM, Ctrl-C or a ``stop`` control
message; then it shuts down gracefully and exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus
from pydantic import Field

from troupe.runtime.chaos.worker_side import WorkerChaos
from troupe.runtime.core.control_payloads import ControlPayload, validated
from troupe.runtime.core.directory import Directory
from troupe.runtime.core.process_role import set_role
from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.core.throttle import PeerThrottle
from troupe.runtime.errors import ConfigError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.logs import configure_logging
from troupe.runtime.metrics.actor_metrics import read_actor_metrics
from troupe.runtime.security.process import install_from_env, security_status
from troupe.runtime.start_limits import limit_line
from troupe.runtime.supervision.worker_health import WorkerHealth
from troupe.runtime.tasks.getter_start import start_task_getter
from troupe.runtime.wire.codec import load_imported_extensions

from .child import die_with_parent, load_launch_spec, name_process, run_and_exit
from .config import ActorSpec, _Frozen
from .reach import LOOPBACK_ANY_PORT

__all__ = ["ActorStartFailed", "WorkerLaunch", "failure_line", "main", "serve_worker", "start_failure_line"]

log = get_logger(__name__)

SPEC_ENV = "TROUPE_WORKER_SPEC"
_MESSAGE_MOST = 500  # characters of a failed constructor's message on its one line


class WorkerLaunch(_Frozen):
    """Everything a worker process needs, handed over by its node."""

    node: str
    process: str
    node_endpoint: str
    # Where its mailboxes listen (a free port each): the node's host, so other hosts reach them.
    bind: str = LOOPBACK_ANY_PORT
    actors: tuple[ActorSpec, ...] = ()
    kind: str = "default"
    incarnation: int = Field(default=0, ge=0)
    restart_reason: str | None = None
    log_dir: Path | None = None
    log_level: str = "info"
    # The log file's size, past which this worker rotates it too (log_files); None: it does not.
    log_max_bytes: int | None = Field(default=None, gt=0)
    log_keep: int = Field(default=5, ge=1)
    hwm: int = 1000
    max_message_mb: float = 64.0
    max_frames: int = 1024
    bad_frames_burst: int = 20
    bad_frames_per_s: float = 10.0
    throttle_s: float = 10.0
    ask_timeout_s: float = 30.0
    drain_timeout_s: float = 5.0
    # Supervision (worker_health.py): where heartbeats go, None = no supervisor.
    supervisor_addr: tuple[str, int] | None = None
    heartbeat_interval_s: float = Field(default=0.5, gt=0)
    # Task dispatch (tasks/getter.py, started by tasks/getter_start.py): the master to pull
    # tasks from, None = no master.
    master: str | None = None


def node_lookup(runtime_box: list[Runtime], node_endpoint: str):  # type: ignore[no-untyped-def]
    """Return a directory lookup that asks the node (the runtime is set once it exists)."""

    async def lookup(address: ActorAddress) -> tuple[ActorAddress, str]:
        reply = await runtime_box[0].control(node_endpoint, "resolve", {"address": str(address)})
        return ActorAddress.parse(reply["address"]), reply["endpoint"]

    return lookup


async def serve_worker(spec: WorkerLaunch, log_file: Path | None = None) -> None:
    """Run the worker until it is told to stop (``log_file``: where its log lines go, if anywhere).

    Raises:
        ActorStartFailed: an actor's constructor raised.
    """
    from troupe.runtime.wire.codec import Codec

    box: list[Runtime] = []
    directory = Directory(spec.node, node_lookup(box, spec.node_endpoint))
    directory.learn(f"{spec.node}/node", spec.node_endpoint)
    runtime = process_runtime(
        spec.node,
        spec.process,
        bind=spec.bind,
        hwm=spec.hwm,
        directory=directory,
        codec=Codec(int(spec.max_message_mb * 1024 * 1024), spec.max_frames),
        throttle=PeerThrottle(spec.bad_frames_burst, spec.bad_frames_per_s, spec.throttle_s),
        ask_timeout=spec.ask_timeout_s,
        drain_timeout=spec.drain_timeout_s,
    )
    box.append(runtime)
    stop = anyio.Event()

    async def tell_node(actor: ActorSpec, endpoint: str) -> None:
        await runtime.control(
            spec.node_endpoint,
            "actor_spawned",
            {"process": spec.process, "actor": actor.model_dump(by_alias=True), "endpoint": endpoint},
            timeout=10.0,
        )

    chaos = WorkerChaos(runtime)
    install_worker_controls(runtime, stop, tell_node, chaos)
    health = WorkerHealth(runtime, spec.process, spec.supervisor_addr, spec.heartbeat_interval_s)
    async with runtime, anyio.create_task_group() as tg:
        for actor in spec.actors:
            await _start_actor(runtime, actor, spec.restart_reason, log_file)
        # Actors that imported torch get its codec now, not as a stall on their first tensor.
        load_imported_extensions()
        # Before it registers: the node may stop it as soon as it knows it (a SIGTERM then
        # must be a graceful stop, not the default signal's death).
        await tg.start(_stop_on_signal, stop)
        await runtime.control(
            spec.node_endpoint,
            "register",
            {
                "process": spec.process,
                "endpoint": runtime.address,
                "pid": os.getpid(),
                "incarnation": spec.incarnation,
                "actors": {name: cell.endpoint for name, cell in runtime.cells.items()},
            },
            timeout=10.0,
        )
        log.info("worker_ready", endpoint=runtime.address, actors=sorted(runtime.cells))
        if spec.master:  # task dispatch: pull tasks for the hosted TaskActors, if any
            start_task_getter(runtime, spec.master, spec.node, spec.process)
        await stop.wait()
        tg.cancel_scope.cancel()
        log.info("worker_stopping")
        health.stopping()
    health.close()
    log.info("worker_stopped")


class ActorStartFailed(Exception):
    """An actor's constructor raised: its message is one line (the exception, where it was
    raised, where its traceback went), the worker's last on stderr, which its node reports."""


async def _start_actor(runtime: Runtime, actor: ActorSpec, reason: str | None, log_file: Path | None) -> None:
    """Start one of the worker's actors. A constructor that raises (a missing file, a bad
    kwarg) is a user's error, not the worker's: one line on stderr, not the worker's own
    traceback of forty lines before the run's error; the traceback goes to the log file."""
    try:
        await runtime.spawn(actor.cls, actor.name, kwargs=dict(actor.kwargs), restart_reason=reason)
    except Exception as exc:
        log.error("actor_start_failed", actor=actor.name, cls=actor.cls, exc_info=exc)
        raise ActorStartFailed(start_failure_line(exc, actor.cls, log_file)) from exc


def start_failure_line(exc: BaseException, cls: str, log_file: Path | None) -> str:
    """``ValueError: no model at m.pt (raised in Encoder at actors.py:31; traceback in LOG)``:
    the exception first, as the node's reading of a worker's stderr expects (``StderrTail``)."""
    text = " ".join(str(exc).split())
    cut = text if len(text) <= _MESSAGE_MOST else text[: _MESSAGE_MOST - 3] + "..."
    # The innermost frame of the actor's own code: one of the runtime's is where it called the
    # class (a constructor given arguments it does not take raises there), not where to look.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _in_runtime(f.filename)]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    logged = f"; traceback in {log_file}" if log_file is not None else ""
    said = f"{type(exc).__name__}: {cut}" if cut else type(exc).__name__
    if isinstance(exc, ConfigError):  # troupe's own refusal (a class that does not import): whole
        return said
    return f"{said} (raised in {cls}{where}{logged})"


_RUNTIME_DIR = Path(__file__).resolve().parents[1]


def _in_runtime(filename: str) -> bool:
    """Whether ``filename`` is a module of troupe's runtime (not of the actors, troupe's own
    included)."""
    try:
        return Path(filename).resolve().is_relative_to(_RUNTIME_DIR)
    except (OSError, ValueError):
        return False


def install_worker_controls(
    runtime: Runtime,
    stop: anyio.Event,
    tell_node: Callable[[ActorSpec, str], Awaitable[None]],
    chaos: WorkerChaos | None = None,
) -> None:
    """Register the control messages every worker answers.

    ``tell_node`` reports an actor started by a ``spawn`` control message to the node, which
    names it in the directory and keeps it in the worker's spec for restarts. ``chaos``: the
    worker's fault injection, whose armed faults its status names.
    """

    async def ping(_: Any) -> dict[str, Any]:
        return {"process": runtime.process, "pid": os.getpid()}

    async def status(_: Any) -> dict[str, Any]:
        # Each actor's own figures (its metrics(), if it defines one): the node exports them.
        figures = read_actor_metrics({name: cell.actor for name, cell in runtime.cells.items()})
        faults = chaos.armed() if chaos is not None else []
        return {
            **asdict(runtime.statistics()),
            "security": security_status(False),
            "actor_metrics": figures,
            "faults": faults,
        }

    async def stop_worker(_: Any) -> bool:
        stop.set()
        return True

    async def directory_update(payload: Any) -> bool:
        # The peer process restarted: its mailboxes moved. Drop what we knew, learn the new.
        p = ControlPayload("directory_update", payload)
        key, endpoint, actors = (
            p.require("key", str),
            p.require("endpoint", str),
            p.map_of_str("actors", False),
        )
        current = {endpoint, *actors.values()}
        for old in runtime.directory.forget_process(key):
            if old not in current:  # a connection to a live endpoint keeps what it has queued
                runtime.transport.forget(old)
        runtime.directory.learn(key, endpoint)
        for name, actor_endpoint in actors.items():
            runtime.directory.learn(f"{key}/{name}", actor_endpoint)
        return True

    async def spawn(payload: Any) -> str:
        spec = validated(ActorSpec, payload, "spawn")
        await runtime.spawn(spec.cls, spec.name, kwargs=dict(spec.kwargs))
        load_imported_extensions()  # as at start: an actor that imported torch gets its codec now
        try:
            await tell_node(spec, runtime.cells[spec.name].endpoint)
        except Exception as exc:  # the actor runs; only its name is not known beyond this process
            log.warning("spawned_actor_not_announced", actor=spec.name, error=repr(exc))
        return str(ActorAddress(runtime.node, runtime.process, spec.name))

    runtime.register_controls(
        dict(ping=ping, status=status, stop=stop_worker, directory_update=directory_update, spawn=spawn)
    )


async def _stop_on_signal(
    stop: anyio.Event, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            stop.set()
            break
    ignore_stop_signals()


def ignore_stop_signals() -> None:
    """Once a graceful stop has begun, a second SIGTERM or Ctrl-C must not cut it short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main() -> None:
    """Entry point of ``python -m troupe.runtime.node.worker_process``."""
    die_with_parent()
    spec = load_launch_spec(
        WorkerLaunch, SPEC_ENV, "worker", "worker processes are started by `troupe node start`"
    )
    name_process(f"troupe worker {spec.process} (node {spec.node})", spec.process)
    set_role("worker")
    log_file = configure_logging(
        spec.node,
        spec.process,
        spec.log_dir,
        console=False,
        level=spec.log_level,
        rotate_at_bytes=spec.log_max_bytes,
        keep=spec.log_keep,
    )
    try:
        install_from_env()  # the node's keys, if it has any
        try:
            anyio.run(serve_worker, spec, log_file, backend="asyncio", backend_options={"use_uvloop": True})
        except* ActorStartFailed as group:
            sys.exit(str(group.exceptions[0]))
    except ConfigError as exc:
        log.error("worker_config_error", error=str(exc))
        sys.exit(f"worker {spec.process}: {exc}")
    except Exception as exc:
        # The worker's own failure (its heartbeat thread refused, say): its traceback to the
        # log file, one line to stderr, which its node reads and the run's terminal shows.
        log.error("worker_failed", exc_info=exc)
        sys.exit(failure_line(exc, log_file))


def failure_line(exc: BaseException, log_file: Path | None) -> str:
    """The one line a worker that failed says on stderr: the limit that refused a start where
    one did (``start_limits.limit_line``), else the exception (the first, in a group) and
    where its traceback went."""
    limited = limit_line(exc)
    if limited is not None:
        return limited
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return said + (f" (traceback in {log_file})" if log_file is not None else "")


if __name__ == "__main__":
    run_and_exit(main)  # no module teardown: its node, stopping, waits for this exit
