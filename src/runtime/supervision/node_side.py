"""The node's side of supervision: it owns the supervisor process and restarts workers.

:class:`NodeSupervision` is the glue between a node (seen through
:class:`~troupe.runtime.node.ports.SupervisedNode`) and the pieces that decide:

- it spawns the supervisor (``python -m troupe.runtime.supervision.supervisor``) before any worker, waits
  for its ``supervisor_ready``, and gives every worker the supervisor's UDP address;
- it sends ``watch`` when a worker registers and ``unwatch`` when it exits;
- when a worker exits, it tells the ``worker_exit_listeners`` of the node (the task layer
  requeues the dead worker's tasks there, at once), then asks a
  :class:`~.restart.RestartTracker`: ``Restart`` relaunches the worker after the backoff with
  the reason (its actors get ``restarted(reason)``); ``GiveUp`` marks it FAILED, logged and
  shown by ``ctl status``; the node stays up. A worker stopped on purpose is not restarted;
- it restarts a dead supervisor (noticed by ``waitpid``), under a restart policy of its own, and
  sends ``watch`` again for every running worker;
- it asks the supervisor every second whether it answers (``status``): one that stops answering
  (SIGSTOP, hung) watches no worker, so the node warns (``supervisor_not_answering``), and
  after ``supervisor_timeout_s`` of silence SIGKILLs it: from there it is a dead supervisor.

Why a worker died comes, in order of preference, from the supervisor's ``worker_killed`` report
(sent before its SIGKILL), from the node's own chaos kill, or from the exit status; a SIGKILL
none of them explains (nor a stop) says so, with the worker's last sampled memory and the OOM
kills of the node's cgroup (``memory_kills.py``).

Node control messages added here (besides ``chaos`` and ``heal``, see ``chaos/relay.py``):

- ``supervisor_ready`` ``{"endpoint", "udp": [host, port], "pid"}`` -> ``true``: from the
  supervisor once it listens; the node then sends ``watch`` for every registered worker (and
  ``heartbeat_to`` to the workers if the UDP port changed).
- ``worker_killed`` ``{"worker", "pid", "reason", "last_status", "silent_s"}`` -> ``true``
  (``false`` for an old incarnation): from the supervisor, before it SIGKILLs the worker.
- ``supervision`` (payload ignored) -> ``{"node", "workers": [worker record...],
  "supervision": {...}}``: a light status that asks no worker, so it stays fast while one
  hangs; ``status`` carries the same ``supervision`` map.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import Process, TaskGroup

from troupe.runtime.chaos.relay import ChaosRelay
from troupe.runtime.core.control_payloads import ControlPayload
from troupe.runtime.errors import BadRequest
from troupe.runtime.library_logging import get_logger
from troupe.runtime.node.child import child_env
from troupe.runtime.node.own_processes import is_own_descendant
from troupe.runtime.node.template_link import start_child
from troupe.runtime.node.worker_handles import HandleState, WorkerHandle
from troupe.runtime.start_limits import start_failure

from .memory_kills import SAMPLE_EVERY_S, MemorySamples
from .restart import (
    Exited,
    GiveUp,
    Healthy,
    Removed,
    Restart,
    RestartPolicy,
    RestartTracker,
    Started,
)
from .start_bound import bound_start
from .supervisor import SPEC_ENV

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime
    from troupe.runtime.node.ports import SupervisedNode

__all__ = ["NodeSupervision"]

log = get_logger(__name__)

_SUPERVISOR = "supervisor"
_LAUNCH_WAIT_S = 30.0  # a stop waits this long for a supervisor being started (a spawn: about 1 s)
_SUPERVISOR_POLICY = RestartPolicy(max_restarts=10, period_s=60.0, backoff_base_s=0.05, backoff_max_s=2.0)
_READY_TIMEOUT_S = 30.0
_CONTROL_TIMEOUT_S = 2.0
_ASK_EVERY_S = 1.0  # the node's look at whether its supervisor answers


class NodeSupervision:
    """Supervision for one node: its supervisor process, watches, and worker restarts.

    Args:
        node: the node (what :class:`~troupe.runtime.node.ports.SupervisedNode` lists of it);
            its config's ``[supervision]`` and ``[restart]`` tables apply.
    """

    def __init__(self, node: SupervisedNode) -> None:
        self._node = node
        self._cfg = node.config.supervision
        self._restart_cfg = node.config.restart
        self.enabled = self._cfg.enabled
        self.tracker = RestartTracker(self._restart_cfg.policy())
        self._sup_tracker = RestartTracker(_SUPERVISOR_POLICY)
        self.chaos = ChaosRelay(node, self)
        self.endpoint: str | None = None
        self.udp: tuple[str, int] | None = None
        self.pid: int | None = None
        self.starts = 0
        self.start_kind: str | None = None  # "fork" (from the node's template) or "spawn"
        self.failed = False
        self._proc: Process | None = None
        self._launched = anyio.Event()  # no launch of the supervisor under way (stop waits for one)
        self._launched.set()
        self._ready = anyio.Event()
        self._tg: TaskGroup | None = None
        self._reasons: dict[int, str] = {}  # worker pid -> why it is being killed
        self.kills: dict[str, dict[str, Any]] = {}  # worker -> the supervisor's last kill report
        # worker -> the pid of its last exit: a kill report the node reads only after that exit
        # (a node too busy to answer within the supervisor's wait) still says why it died.
        self._exited: dict[str, int] = {}
        # Restarts by (worker, kind) over the node process's life: a handle's own count starts
        # at 0 when the node replaces it (an undrain's start, a rerun's replica of the name).
        self._restarts: Counter[tuple[str, str]] = Counter()
        self.memory = MemorySamples()  # for a SIGKILL no part of troupe sent (memory_kills.py)

    # -- wiring ---------------------------------------------------------------------------------

    def install(self, runtime: Runtime) -> None:
        """Add the node's supervision control messages (and ``chaos`` / ``heal``)."""
        runtime.register_controls(
            {
                "supervisor_ready": self._supervisor_ready,
                "worker_killed": self._worker_killed,
                "supervision": self._supervision_status,
            }
        )
        self.chaos.install(runtime)

    async def start(self, tg: TaskGroup) -> None:
        """Spawn the supervisor and wait until it is ready (or log that it did not come up)."""
        self._tg = tg
        tg.start_soon(self._sample_memory)
        if not self.enabled:
            return
        # The configured workers show as starting while the supervisor comes up, so that a
        # status poll never takes a node with no workers listed yet for a ready one.
        for spec in self._node.config.workers:
            self._node.workers.setdefault(spec.name, WorkerHandle(spec))
        # The heartbeat port is chosen here, so that workers can be launched with it while the
        # supervisor is still starting (in parallel, not one after the other): beats sent
        # before it listens are lost harmlessly, and it watches every worker once it is ready.
        if self.udp is None:
            self.udp = ("127.0.0.1", _free_udp_port())
        tg.start_soon(self._keep_supervisor)
        tg.start_soon(self._warn_if_late)
        tg.start_soon(self._kill_if_silent)

    async def _warn_if_late(self) -> None:
        with anyio.move_on_after(_READY_TIMEOUT_S) as scope:
            await self._ready.wait()
        if scope.cancelled_caught:
            log.error(
                "supervisor_not_ready",
                timeout_s=_READY_TIMEOUT_S,
                hint="workers run unwatched until it comes up; see the node log",
            )

    def launch_options(self, handle: WorkerHandle) -> dict[str, Any]:
        """The supervision fields of a worker's launch spec (``WorkerLaunch``)."""
        return {
            "supervisor_addr": list(self.udp) if self.udp is not None else None,
            "heartbeat_interval_s": self._cfg.policy_for(handle.spec.kind).interval_s,
        }

    def worker_launched(self, handle: WorkerHandle) -> None:
        """A worker's incarnation was launched: bound its start (``start_bound.py``)."""
        bound, setting = self._cfg.start_timeout_for(handle.spec.kind)
        if self.enabled and bound > 0 and self._tg is not None:
            self._tg.start_soon(bound_start, handle, bound, self.note_kill, setting)

    def note_kill(self, pid: int | None, reason: str) -> None:
        """Record why the process ``pid`` is about to be killed, for its exit report."""
        if pid:
            self._reasons[pid] = reason

    # -- worker life cycle ------------------------------------------------------------------

    def worker_registered(self, handle: WorkerHandle) -> None:
        """A worker (re)started and registered: watch it, and count it as running."""
        self.tracker.handle(Started(handle.spec.name), time.monotonic())
        if self._tg is None:
            return
        self._tg.start_soon(self._healthy_later, handle, handle.incarnation)
        if self.endpoint is not None and handle.pid:
            self._tg.start_soon(
                self._send_watch, self.endpoint, handle.spec.name, handle.pid, handle.spec.kind
            )

    def worker_exited(self, handle: WorkerHandle) -> None:
        """A worker was reaped: unwatch it, tell the listeners, restart it or give up."""
        node, name, now = self._node, handle.spec.name, time.monotonic()
        reason = self._reasons.pop(handle.pid or 0, None)
        if handle.pid:
            self._exited[name] = handle.pid
        if reason is not None:
            handle.exit_reason = f"{reason} ({handle.exit_reason})"
        elif handle.returncode == -signal.SIGKILL and handle.state is not HandleState.STOPPED:
            # No part of troupe sent it (each notes why it kills): most likely the OOM killer.
            handle.exit_reason = f"{handle.exit_reason} ({self.memory.unexplained_kill(name)})"
        else:
            self.memory.rss.pop(name, None)
        reason = reason or handle.exit_reason
        if self._tg is not None and self.endpoint is not None:
            self._tg.start_soon(
                self._control, self.endpoint, "unwatch", {"worker_id": name, "pid": handle.pid}
            )
        for listener in list(node.worker_exit_listeners):
            try:
                listener(handle, reason)
            except Exception as exc:  # one bad listener must not stop the restart
                log.error("worker_exit_listener_failed", worker=name, error=repr(exc))
        if handle.state is HandleState.STOPPED or node.stopping.is_set():
            self.tracker.handle(Removed(name), now)
            return
        code = handle.returncode
        event = Exited(
            name,
            reason,
            exit_code=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
        )
        for cmd in self.tracker.handle(event, now):
            if isinstance(cmd, Restart):
                handle.restarts += 1
                self._restarts[name, handle.spec.kind] += 1
                log.warning(
                    "worker_restart_scheduled",
                    worker=name,
                    reason=reason,
                    attempt=cmd.attempt,
                    delay_s=round(cmd.delay_s, 3),
                )
                if self._tg is not None:
                    self._tg.start_soon(self._restart_later, handle, cmd.delay_s, reason)
            elif isinstance(cmd, GiveUp):
                handle.state = HandleState.FAILED
                log.error(
                    "worker_failed",
                    worker=name,
                    reason=reason,
                    restarts=cmd.restarts,
                    period_s=cmd.period_s,
                    hint="restart intensity exceeded; find the cause in this worker's log "
                    "lines, fix it, then restart the node (troupe node start)",
                )

    @property
    def worker_restarts(self) -> Mapping[tuple[str, str], int]:
        """Restarts by ``(worker, kind)`` since the node started; they only grow (a counter)."""
        return MappingProxyType(self._restarts)

    async def _restart_later(self, handle: WorkerHandle, delay_s: float, reason: str) -> None:
        await anyio.sleep(delay_s)
        node = self._node
        # Stopped, replaced or shutting down meanwhile: the restart is moot.
        if node.stopping.is_set() or node.workers.get(handle.spec.name) is not handle:
            return
        if handle.state is not HandleState.EXITED or self._tg is None:
            return
        node.start_worker(self._tg, handle.spec, restart_reason=reason)

    async def _healthy_later(self, handle: WorkerHandle, incarnation: int) -> None:
        await anyio.sleep(self._restart_cfg.healthy_after_s)
        if handle.incarnation == incarnation and handle.state is HandleState.RUNNING:
            self.tracker.handle(Healthy(handle.spec.name), time.monotonic())

    # -- the supervisor process -------------------------------------------------------------

    async def _keep_supervisor(self) -> None:
        node = self._node
        while not node.stopping.is_set():
            try:
                proc = await self._launch_supervisor()
            except (OSError, RuntimeError) as exc:
                # A fork refused (a process limit reached): a failed start, under the
                # supervisor's restart policy, as an exit is; raised, it ended the node.
                error = start_failure(exc)
                if error is None:
                    raise
                log.error("supervisor_start_failed", error=error)
                ended = error
            else:
                code = await proc.wait()
                self._proc, self.endpoint, self.pid = None, None, None
                if node.stopping.is_set():
                    return
                self._ready = anyio.Event()
                log.error("supervisor_exited", returncode=code)
                ended = f"returncode {code}"
            cmds = self._sup_tracker.handle(Exited(_SUPERVISOR, ended), time.monotonic())
            if not cmds or isinstance(cmds[0], GiveUp):
                self.failed = True
                log.error("supervisor_failed", hint="the node runs on without hang detection")
                return
            assert isinstance(cmds[0], Restart)
            await anyio.sleep(cmds[0].delay_s)

    async def _sample_memory(self) -> None:
        """Each running worker's memory, every second: an exit that no one here caused says it."""
        while not self._node.stopping.is_set():
            self.memory.sample(list(self._node.workers.values()))
            await anyio.sleep(SAMPLE_EVERY_S)

    async def _kill_if_silent(self) -> None:
        """Ask the ready supervisor whether it answers; SIGKILL it once silent for
        ``supervisor_timeout_s`` (``_keep_supervisor`` then starts another, as for a crash)."""
        node, bound = self._node, self._cfg.supervisor_timeout_s
        silent_since: float | None = None
        killed: Process | None = None  # until its exit is seen: judged once
        while not node.stopping.is_set():
            await anyio.sleep(_ASK_EVERY_S)
            proc, endpoint, runtime = self._proc, self.endpoint, node.runtime
            if proc is None or endpoint is None or runtime is None or proc.returncode is not None:
                silent_since = None  # not started or not ready yet: nothing to judge
                continue
            if proc is killed:
                continue
            try:
                await runtime.control(endpoint, "status", None, timeout=min(_CONTROL_TIMEOUT_S, bound))
            except Exception as exc:
                if node.stopping.is_set():
                    return
                now = time.monotonic()
                if silent_since is None:
                    silent_since = now
                    log.warning("supervisor_not_answering", supervisor_pid=proc.pid, error=repr(exc))
                elif now - silent_since >= bound and self._proc is proc:
                    log.error(
                        "supervisor_killed_silent",
                        supervisor_pid=proc.pid,
                        silent_s=round(now - silent_since, 1),
                    )
                    _send(proc, signal.SIGKILL)
                    killed, silent_since = proc, None
                continue
            if silent_since is not None:
                log.info("supervisor_answers_again", supervisor_pid=proc.pid)
            silent_since = None

    async def _launch_supervisor(self) -> Process:
        cfg = self._node.config
        spec = {
            "node": self._node.name,
            "node_endpoint": self._node.runtime.address if self._node.runtime else "",
            "udp_port": self.udp[1] if self.udp is not None else 0,
            "supervision": self._cfg.model_dump(),
            "reap_timeout_s": max(cfg.stop_grace_s, 1.0),
            "log_dir": str(cfg.log_dir.resolve()),
            "log_level": cfg.log_level,
            "log_max_bytes": cfg.log_max_bytes,
            "log_keep": cfg.log_keep,
        }
        env = child_env({SPEC_ENV: json.dumps(spec)})
        # A template that is ready forks it in milliseconds; a spawned one imports for most of
        # a second, on the cores the node's first workers start on. Shielded, and awaited by
        # stop(): a stop that came while it started found no process to stop, and the one that
        # started next lived on until its wait for the node's answer ran out (about 10 s).
        self._launched = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                proc, self.start_kind = await start_child(self._node.template, "supervisor", env)
                self._proc = proc
        finally:
            self._launched.set()
        self.pid = proc.pid
        self._node.children.add(proc.pid, "supervisor")
        self.starts += 1
        log.info("supervisor_spawned", supervisor_pid=proc.pid, start=self.starts, how=self.start_kind)
        return proc

    async def stop(self) -> None:
        """SIGTERM the supervisor, wait the node's grace, SIGKILL, reap (at node shutdown); one
        that is being started is waited for first, and stopped too."""
        with anyio.move_on_after(_LAUNCH_WAIT_S):
            await self._launched.wait()
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        _send(proc, signal.SIGTERM)
        with anyio.move_on_after(self._node.config.stop_grace_s):
            await proc.wait()
        if proc.returncode is None:
            log.warning("supervisor_kill_after_grace", supervisor_pid=proc.pid)
            _send(proc, signal.SIGKILL)
            with anyio.move_on_after(5.0):
                await proc.wait()

    # -- control messages -------------------------------------------------------------------

    async def _supervisor_ready(self, payload: Any) -> bool:
        p = ControlPayload("supervisor_ready", payload)
        udp, pid = p.host_port("udp"), p.require("pid", int)
        if not is_own_descendant(pid):  # it would send every worker's heartbeats elsewhere
            log.warning("supervisor_ready_refused", supervisor_pid=pid, udp=f"{udp[0]}:{udp[1]}")
            raise BadRequest(
                f"control 'supervisor_ready': pid {pid} is not a process that node {self._node.name} started"
            )
        moved = self.udp is not None and udp != self.udp
        self.endpoint, self.udp = p.require("endpoint", str), udp
        # Every worker whose current incarnation registered, running or not: a forked one can
        # register before the template's reply with its pid is read, still "starting" here, and
        # neither that registration (no supervisor then) nor its launch sends a watch.
        registered = [
            h
            for h in self._node.workers.values()
            if h.state in (HandleState.RUNNING, HandleState.STARTING) and h.endpoint and h.pid
        ]
        for handle in registered:
            if self._tg is not None:
                self._tg.start_soon(self._rewatch, handle, moved)
        log.info(
            "supervisor_registered",
            endpoint=self.endpoint,
            udp=f"{udp[0]}:{udp[1]}",
            rewatched=len(registered),
            moved=moved,
        )
        self._ready.set()
        return True

    async def _supervision_status(self, _: Any) -> dict[str, Any]:
        # A light status: unlike ``status`` it asks no worker, so a hung one does not slow it.
        return {
            "node": self._node.name,
            "workers": [h.describe() for h in self._node.workers.values()],
            "supervision": await self.describe(),
        }

    async def _worker_killed(self, payload: Any) -> bool:
        p = ControlPayload("worker_killed", payload)
        pid, reason, worker = p.require("pid", int), p.require("reason", str), p.require("worker", str)
        handle = self._node.workers.get(worker)
        late = handle is None or handle.pid != pid
        if late and self._exited.get(worker) != pid:
            return False  # an older incarnation's, or no worker of ours
        if not late:
            self.note_kill(pid, reason)
        # Late: its exit, and the restart, came first; status and the log still say why.
        self.kills[worker] = {**payload, "late": True} if late else dict(payload)
        log.warning(
            "worker_killed",
            worker=worker,
            worker_pid=pid,
            reason=reason,
            silent_s=payload.get("silent_s"),
            last_status=payload.get("last_status"),
            **({"late": True} if late else {}),
        )
        return True

    async def _rewatch(self, handle: WorkerHandle, moved: bool) -> None:
        if moved:  # the old port was taken: this worker still beats to the dead supervisor's
            await self._control(handle.endpoint or "", "heartbeat_to", {"addr": list(self.udp or ())})
        if self.endpoint is not None and handle.pid:
            await self._send_watch(self.endpoint, handle.spec.name, handle.pid, handle.spec.kind)

    async def _send_watch(self, endpoint: str, worker: str, pid: int, kind: str) -> None:
        await self._control(endpoint, "watch", {"worker_id": worker, "pid": pid, "kind": kind})

    async def _control(
        self, endpoint: str, msg_type: str, payload: Any, timeout: float = _CONTROL_TIMEOUT_S
    ) -> Any:
        runtime = self._node.runtime
        if runtime is None:
            return None
        try:
            return await runtime.control(endpoint, msg_type, payload, timeout=timeout)
        except Exception as exc:  # a restarting peer catches up when it registers again
            level = logging.INFO if self._node.stopping.is_set() else logging.WARNING  # a stop's, no fault
            log.log(level, "supervision_control_failed", type=msg_type, endpoint=endpoint, error=repr(exc))
            return None

    async def describe(self) -> dict[str, Any]:
        """Plain data for the node's status reply: the supervisor and the restart records."""
        restarts = self.tracker.statistics(time.monotonic())
        info: dict[str, Any] = {
            "enabled": self.enabled,
            "supervisor_pid": self.pid,
            "supervisor_endpoint": self.endpoint,
            "supervisor_udp": None if self.udp is None else f"{self.udp[0]}:{self.udp[1]}",
            "supervisor_starts": self.starts,
            "supervisor_start": self.start_kind,
            "supervisor_failed": self.failed,
            "restarts_total": restarts.total_restarts,
            "give_ups": restarts.give_ups,
            "kills": dict(self.kills),
            "workers": {
                w: {
                    "state": r.state.value,
                    "restarts_in_window": r.restarts_in_window,
                    "last_reason": r.last_reason,
                }
                for w, r in restarts.workers.items()
            },
        }
        if self.endpoint is not None:
            info["supervisor"] = await self._control(self.endpoint, "status", None, timeout=1.0)
        return info


def _send(proc: Process, signum: signal.Signals) -> None:
    try:
        proc.send_signal(signum)
    except ProcessLookupError:
        pass


def _free_udp_port() -> int:
    """A loopback UDP port that was free a moment ago (the supervisor binds it next)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
