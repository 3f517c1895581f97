"""What a node knows about each of its worker processes, and how it launches one.

A worker's stderr comes to the node through a pipe: the node passes it on to its own stderr
(where it went before) and keeps the last few KiB of each incarnation, so that when a worker
exits with an error the status reply can say why (``last_error``: the exception's one-line
summary, e.g. ``ModuleNotFoundError: No module named 'mypkg'``), not only ``exit 1``.
"""

from __future__ import annotations

import enum
import json
import os
import re
import signal
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import ByteReceiveStream, Process

from .child import child_env
from .config import NodeConfig, WorkerSpec
from .forked_process import UNKNOWN_EXIT
from .reach import worker_bind
from .template_link import TemplateLink, spec_classes, start_child

if TYPE_CHECKING:
    import psutil

__all__ = ["START_FAILED", "HandleState", "StderrTail", "WorkerHandle", "exit_reason", "launch_worker"]

# The exit reason of an incarnation whose process could not be started (a fork refused).
START_FAILED = "start_failed"

_TAIL_BYTES = 8192
_DRAIN_S = 1.0  # after the exit: a grandchild holding the pipe open must not hold up the node
_MAX_ERROR_CHARS = 300
# The last line of a Python traceback: ``ValueError: boom``, ``pkg.mod.SomeError: text``.
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Failed|Injected|Interrupt)\b(: .*)?")


class HandleState(enum.Enum):
    """Where a worker process is in its life, as its node's handle sees it.

    Not what the worker is doing while it lives: that is
    :class:`troupe.runtime.supervision.status.WorkerState` (idle, busy, stopping).
    """

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
        self.state = HandleState.STARTING
        self.process: Process | None = None
        self.pid: int | None = None
        self.endpoint: str | None = None
        self.actors: dict[str, str] = {}  # actor name -> its mailbox endpoint
        self.incarnation = 0
        self.restarts = 0
        self.returncode: int | None = None
        self.exit_reason = ""
        self.last_error: str | None = None  # the last error a failed incarnation wrote to stderr
        self.exit_error: str | None = None  # the error of the incarnation that exited last, if any
        self.started_at = 0.0
        self.start_mode = ""  # how the current incarnation was started: "fork" (template) or "spawn"
        self.ready_event = anyio.Event()
        self.exited_event = anyio.Event()
        # Spawned on request (``spawn_worker``): an exit before it registers is reported to the
        # requester and not restarted; once it has run, it is restarted like any worker.
        self.fail_fast = False
        self.spawned = False  # started by ``spawn_worker`` rather than named in the node's config
        # ``stop_worker`` came while the worker was being started, before its process existed:
        # it is stopped as soon as it does (``launched`` keeps it STOPPING).
        self.stop_asked = False
        # The runtime that asked for it (``spawn_worker``'s ``owner``): gone, the node stops it.
        self.owner: str | None = None
        self.owner_process = ""  # the owner's process (``process_identity``): "" if not said
        # The processes below the worker when the node signalled it: killed once it has exited
        # (``worker_descendants.py``), for by then they are no longer below it.
        self.descendants: list[psutil.Process] = []

    def launched(self, process: Process) -> None:
        """A new incarnation of the worker was started."""
        # A worker forked from the template can register before the template's reply with its
        # pid reaches the node: that registration stands (it was reset to "starting" for good).
        early = self.endpoint is not None and self.pid == process.pid
        self.process = process
        self.pid = process.pid
        self.returncode = None
        self.descendants = []
        if self.stop_asked:
            self.state = HandleState.STOPPING
        else:
            self.state = HandleState.RUNNING if early else HandleState.STARTING
        self.started_at = time.time()
        # Replace the events only once used, so that a waiter on the first launch is not lost.
        if self.exited_event.is_set():
            self.exited_event = anyio.Event()
        if early:
            self.ready_event.set()  # registered already: ready now that its launch has returned
            return
        self.endpoint = None
        if self.ready_event.is_set():
            self.ready_event = anyio.Event()

    def registered(self, endpoint: str, pid: int, actors: dict[str, str]) -> None:
        """The worker bound its mailbox and its actors have started."""
        self.endpoint = endpoint
        self.pid = pid
        self.actors = actors
        # Running and ready once its launch has returned too: a forked worker can register
        # before the template's reply with its pid reaches the node, and until then how it
        # started and the template's count of forks lag (a node "started" on a loaded machine
        # said start ""). ``launched`` finishes what is left.
        launched = self.process is not None and self.process.pid == pid
        if launched and self.state is HandleState.STARTING:
            self.state = HandleState.RUNNING
        self.fail_fast = False
        if launched:
            self.ready_event.set()
        elif self.ready_event.is_set():  # the last incarnation's: this one's is set by launched()
            self.ready_event = anyio.Event()

    def exited(self, returncode: int) -> None:
        """The process was reaped with ``returncode``."""
        self.returncode = returncode
        self.exit_reason = exit_reason(returncode)
        never_ran = self.fail_fast and self.state is HandleState.STARTING
        gave_up = self.state is HandleState.STOPPING or never_ran
        self.state = HandleState.STOPPED if gave_up else HandleState.EXITED
        self.endpoint = None
        self.exited_event.set()

    def start_failed(self, error: str) -> None:
        """The incarnation's process could not be started (``error``, from ``start_failure``):
        it ends as an exit does, restarted under the node's policy, with no process and no exit
        status of its own (``returncode`` is :data:`UNKNOWN_EXIT`, ``exit_reason`` says why)."""
        self.process = None
        self.exited(UNKNOWN_EXIT)
        self.exit_reason = START_FAILED
        self.exit_error = self.last_error = error

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
            "start": self.start_mode,
            "exit": self.exit_reason,
            "last_error": self.last_error,
        }

    async def wait(self) -> int:
        """Wait until the current incarnation exits, passing its stderr on to the node's.

        Returns:
            Its exit status; an incarnation that failed leaves its error in ``exit_error`` and
            ``last_error`` (which keeps it across later incarnations that say nothing).
        """
        proc = self.process
        assert proc is not None, "wait() before launched()"
        tail = StderrTail()
        async with anyio.create_task_group() as tg:
            if proc.stderr is not None:
                tg.start_soon(tail.pump, proc.stderr)
            code = await proc.wait()
            with anyio.move_on_after(_DRAIN_S):
                await tail.closed.wait()
            tg.cancel_scope.cancel()
        # An error exit only: what a process killed by a signal last wrote is no cause of it.
        self.exit_error = tail.last_error() if code > 0 else None
        self.last_error = self.exit_error or self.last_error
        return code


class StderrTail:
    """Passes a child's stderr on to this process's and keeps its last few KiB."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self.closed = anyio.Event()

    def add(self, chunk: bytes) -> None:
        """Keep ``chunk``, dropping the oldest bytes beyond the tail's size."""
        self._chunks.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._chunks[0]) >= _TAIL_BYTES:
            self._size -= len(self._chunks.popleft())

    async def pump(self, stream: ByteReceiveStream) -> None:
        """Read ``stream`` to its end (or until cancelled), writing everything to fd 2."""
        try:
            async for chunk in stream:
                self.add(chunk)
                _write_stderr(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            self.closed.set()
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    def last_error(self) -> str | None:
        """The error the child reported last: a traceback's final line, else its last line."""
        text = b"".join(self._chunks)[-_TAIL_BYTES:].decode("utf-8", errors="replace")
        # An exception group's traceback nests its members in ``|`` and ``+---`` frames.
        lines = [ln.strip().lstrip("|+").strip() for ln in text.splitlines()]
        lines = [ln for ln in lines if ln and set(ln) - set("-+|")]
        if not lines:
            return None
        found = next((ln for ln in reversed(lines) if _EXCEPTION_LINE.fullmatch(ln)), lines[-1])
        return found[:_MAX_ERROR_CHARS]


def _write_stderr(chunk: bytes) -> None:
    # fd 2 itself, as the child's inherited stderr used to be (sys.stderr may be replaced).
    try:
        view = memoryview(chunk)
        while view:
            view = view[os.write(2, view) :]
    except OSError:
        pass  # no stderr to write to: the tail is still kept


async def launch_worker(
    handle: WorkerHandle,
    node: str,
    node_endpoint: str,
    cfg: NodeConfig,
    restart_reason: str | None,
    supervision: dict[str, Any] | None = None,
    template: TemplateLink | None = None,
) -> Process:
    """Start the worker process of ``handle`` and record it.

    ``supervision`` adds the launch fields of supervision (``supervisor_addr``,
    ``heartbeat_interval_s``; see ``NodeSupervision.launch_options``). With a ``template``
    (``fast_start``), the worker is forked from it, its imports done; without one, or when it
    cannot, the worker is spawned as a fresh interpreter.
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
        "log_max_bytes": cfg.log_max_bytes,
        "log_keep": cfg.log_keep,
        "hwm": cfg.hwm,
        "max_message_mb": handle.spec.max_message_mb or cfg.max_message_mb,
        "max_frames": cfg.max_frames,
        "bad_frames_burst": cfg.bad_frames_burst,
        "bad_frames_per_s": cfg.bad_frames_per_s,
        "throttle_s": cfg.throttle_s,
        "ask_timeout_s": cfg.ask_timeout_s,
        "drain_timeout_s": cfg.drain_timeout_s,
        "master": cfg.master,  # task dispatch: the worker's TaskGetter pulls from it
        "bind": worker_bind(cfg.endpoint, cfg.advertise),  # the node's host: other hosts reach it
        **(supervision or {}),
    }
    env = child_env({"TROUPE_WORKER_SPEC": json.dumps(spec)})
    process, handle.start_mode = await start_child(template, "worker", env, spec_classes([handle.spec]))
    handle.launched(process)
    return process
