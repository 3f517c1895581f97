"""The supervisor: one per node, its own process, out of band. It kills hung workers.

Started by the node as ``python -P -m troupe.lean_start troupe.runtime.supervision.supervisor`` (see
lean_start) with its launch spec (JSON) in ``TROUPE_SUPERVISOR_SPEC``. It binds a UDP heartbeat
port on 127.0.0.1 (the port of its predecessor when the node restarts it, so that running
workers keep beating to the right place) and a ZeroMQ mailbox, then tells the node both with
the control message ``supervisor_ready`` ``{"endpoint", "udp": [host, port], "pid"}``. It
answers ``watch`` ``{"worker_id", "pid", "kind"}``, ``unwatch`` ``{"worker_id", "pid"}`` and
``status``.

Contract (what a watched worker can count on, in order):

1. **Ask.** The heartbeat is the standing question "are you alive and progressing?", and the
   worker's liveness policy is its grace: ``heartbeat_timeout_s`` of silence (the process is
   stuck, for instance in a C call that holds the GIL), or ``progress_timeout_s`` busy with
   beats but no progress (blocked on a lock, a deadlock). A hung worker cannot answer a polite
   stop, so none is sent: the timeout was the grace. Ticks follow the earliest deadline and at
   least every ``interval_s``, so a worker is killed within its heartbeat timeout plus one beat
   (DESIGN.md, invariant 5). Datagrams waiting in the socket are read before every tick, so a
   beat that arrived in time is never mistaken for silence. Nor is the time the supervisor was
   stopped with its workers (the whole node paused: SIGSTOP of its tree, ``docker pause``, a
   frozen cgroup): a tick that comes half a heartbeat timeout later than planned moves every
   worker's clocks on by the gap (liveness ``Resumed``) and logs ``supervisor_resumed``; a
   worker really hung is killed one heartbeat timeout after the resume.
2. **Report.** The supervisor tells the node ``worker_killed`` ``{"worker", "pid", "reason",
   "last_status"}`` *before* it kills (waiting for the answer at most ``_KILL_REPORT_S``), so that
   the node knows why when ``waitpid`` reports the death, and restarts the worker with that
   reason.
3. **SIGKILL the process tree**: the worker's descendants first (so none is orphaned and keeps
   a GPU or a port), then the worker. The process objects were taken when the worker was
   watched, so a pid reused since is never signalled.
4. **Reap with a fresh timeout** (``reap_timeout_s``, counted from the kill, not from the
   deadline): the node is the worker's parent and reaps it by ``waitpid``; the supervisor
   waits for every process of the tree to be gone (or a zombie waiting for its parent) and
   logs any survivor. It logs ``worker_killed`` with the reason and the last status.

The node restarts a dead supervisor and sends ``watch`` again for every running worker.
When the node dies, Linux SIGTERMs the supervisor (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
import psutil
from pydantic import Field

from troupe.runtime.core.control_payloads import ControlPayload
from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.errors import ActorStopped, BadRequest, ConfigError, PeerLost
from troupe.runtime.library_logging import get_logger
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.child import die_with_parent, load_launch_spec, name_process, run_and_exit
from troupe.runtime.node.config import SupervisionConfig, _Frozen
from troupe.runtime.node.own_processes import is_own_descendant
from troupe.runtime.security.process import install_from_env
from troupe.runtime.wire.codec import Codec

from .heartbeat import HeartbeatReceiver
from .liveness import Kill, LivenessMonitor, Register, Resumed, Tick, Unregister

__all__ = ["SPEC_ENV", "Supervisor", "SupervisorLaunch", "kill_tree", "main"]

log = get_logger(__name__)

SPEC_ENV = "TROUPE_SUPERVISOR_SPEC"
_MIN_SLEEP_S = 0.002
# How long a kill waits for the node's answer to its report. A node answers in milliseconds; a
# loaded machine's, later than the half beat (50 ms at interval_s 0.1) this once was: the kill
# went first, the node reaped and restarted the worker, and the report, read then, named an old
# incarnation and was dropped (the exit said "killed by SIGKILL", no kill was recorded).
_KILL_REPORT_S = 5.0
_REAP_POLL_S = 0.01


class SupervisorLaunch(_Frozen):
    """Everything a supervisor process needs, handed over by its node."""

    node: str
    node_endpoint: str
    udp_port: int = 0
    supervision: SupervisionConfig = SupervisionConfig()
    reap_timeout_s: float = 5.0
    log_dir: Path | None = None
    log_level: str = "info"
    # The log file's size, past which the supervisor rotates it too (log_files); None: it does not.
    log_max_bytes: int | None = Field(default=None, gt=0)
    log_keep: int = Field(default=5, ge=1)


def kill_tree(proc: psutil.Process, reap_timeout_s: float) -> list[psutil.Process]:
    """SIGKILL ``proc``'s descendants, then ``proc``; wait up to ``reap_timeout_s`` for them.

    A killed process counts as gone once it is a zombie: reaping is its parent's job (the node,
    by ``waitpid``; init for orphans).

    Args:
        proc: the process, as taken when it was watched (psutil refuses to signal a reused pid).
        reap_timeout_s: a fresh timeout for the whole tree to disappear.

    Returns:
        The processes still running after the timeout (should be none).
    """
    try:
        children = proc.children(recursive=True)
    except psutil.Error:
        children = []
    tree = [*children, proc]
    for p in tree:
        try:
            p.kill()
        except psutil.Error:
            pass  # already gone, or the pid was reused: nothing of ours to kill
    deadline = time.monotonic() + reap_timeout_s
    running = tree
    while True:
        running = [p for p in running if _running(p)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(_REAP_POLL_S)  # runs in a worker thread: a bounded poll, not the event loop


def _running(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


class Supervisor:
    """The supervisor's state and its loops, inside one runtime.

    Args:
        spec: the launch spec.
        runtime: the supervisor's own runtime (for control messages).
        receiver: the bound heartbeat socket.
        clock: monotonic seconds, by which beats and ticks are judged (tests pass one that
            jumps, as a paused node's does).
    """

    def __init__(
        self,
        spec: SupervisorLaunch,
        runtime: Runtime,
        receiver: HeartbeatReceiver,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        cfg = spec.supervision
        self._spec = spec
        self._clock = clock
        self._runtime = runtime
        self._receiver = receiver
        self._monitor = LivenessMonitor(
            {kind: cfg.policy_for(kind) for kind in cfg.kinds}, cfg.policy_for("default")
        )
        self._procs: dict[str, tuple[psutil.Process, str]] = {}  # worker -> (process, kind)
        self._kills = 0
        runtime.register_controls({"watch": self._watch, "unwatch": self._unwatch, "status": self._status})

    async def run(self, stop: anyio.Event) -> None:
        """Report ready to the node, then judge workers until ``stop`` is set."""
        loop = asyncio.get_running_loop()
        loop.add_reader(self._receiver.fileno(), self._read_beats)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._ticks)
                host, port = self._receiver.address
                try:
                    await self._runtime.control(
                        self._spec.node_endpoint,
                        "supervisor_ready",
                        {"endpoint": self._runtime.address, "udp": [host, port], "pid": os.getpid()},
                        timeout=10.0,
                    )
                # The node stopped as this one started (a run ended at once): gone, or still
                # answering as it shuts down.
                except (PeerLost, ActorStopped):
                    log.info("supervisor_node_gone", node=self._spec.node_endpoint)
                    tg.cancel_scope.cancel()
                    return
                log.info("supervisor_ready", udp=f"{host}:{port}", endpoint=self._runtime.address)
                await stop.wait()
                tg.cancel_scope.cancel()
        finally:
            loop.remove_reader(self._receiver.fileno())

    def _read_beats(self) -> None:
        now = self._clock()
        for beat in self._receiver.recv_all():
            self._monitor.handle(beat, now)
        for suspect in self._monitor.take_suspect_beats():
            log.warning(
                "heartbeat_seq_went_back",
                worker=suspect.worker_id,
                worker_pid=suspect.pid,
                seq=suspect.seq,
                last_seq=suspect.last_seq,
                hint="the beat of that last seq was not the worker's (forged: use keys to sign "
                "beats); its beats are taken again",
            )

    async def _ticks(self) -> None:
        interval = self._monitor.tick_interval_s
        last: float | None = None  # when the last tick ran, and when the next was planned
        planned = 0.0
        while True:
            self._read_beats()  # a beat already here must count before its deadline is judged
            now = self._clock()
            if last is not None and now - planned >= self._monitor.resume_after_s:
                self._resumed(now - last, now)
            for kill in self._monitor.handle(Tick(), now):
                self._runtime.start_soon(self._kill, kill)
            deadline = self._monitor.next_deadline()
            wait = interval if deadline is None else min(interval, deadline - now)
            wait = max(wait, _MIN_SLEEP_S)
            last, planned = now, now + wait
            await anyio.sleep(wait)

    def _resumed(self, gap_s: float, now: float) -> None:
        """This process was stopped ``gap_s`` (with its node, as a paused container is): its
        workers were too, and their silence meanwhile is no sign of a hang."""
        self._monitor.handle(Resumed(gap_s), now)
        log.warning(
            "supervisor_resumed",
            gap_s=round(gap_s, 3),
            hint="the supervisor was not running (the node paused or stopped?): the workers' "
            "silence meanwhile is not counted",
        )

    async def _kill(self, kill: Kill) -> None:
        last = None if kill.last_status is None else asdict(kill.last_status)
        # Kept until the node's unwatch: the killed record stays visible in ``status``.
        proc, _ = self._procs.get(kill.worker_id, (None, "default"))
        report = {
            "worker": kill.worker_id,
            "pid": kill.pid,
            "reason": kill.reason.value,
            "last_status": last,
            "silent_s": round(kill.silent_s, 3),
        }
        try:
            await self._runtime.control(
                self._spec.node_endpoint, "worker_killed", report, timeout=_KILL_REPORT_S
            )
        except Exception as exc:  # the kill waits no longer on a node that does not answer
            log.warning("kill_report_failed", worker=kill.worker_id, error=repr(exc))
        survivors: list[psutil.Process] = []
        if proc is not None:
            survivors = await anyio.to_thread.run_sync(kill_tree, proc, self._spec.reap_timeout_s)
        self._kills += 1
        log.warning(
            "worker_killed",
            worker=kill.worker_id,
            worker_pid=kill.pid,
            reason=kill.reason.value,
            silent_s=round(kill.silent_s, 3),
            last_status=last,
        )
        if survivors:
            log.error(
                "kill_survivors",
                worker=kill.worker_id,
                pids=[p.pid for p in survivors],
                reap_timeout_s=self._spec.reap_timeout_s,
            )

    async def _watch(self, payload: Any) -> bool:
        p = ControlPayload("watch", payload)
        worker_id, pid, kind = p.require("worker_id", str), p.require("pid", int), p.require("kind", str)
        if not (is_own_descendant(pid, os.getppid()) or is_own_descendant(pid)):
            # Its node's workers are its siblings (or, where it runs in its node's process, its
            # children): a watch of any other process would have it killed on no heartbeats.
            log.warning("watch_refused", worker=worker_id, worker_pid=pid)
            raise BadRequest(f"control 'watch': pid {pid} is not a process of this supervisor's node")
        try:
            self._procs[worker_id] = (psutil.Process(pid), kind)
        except psutil.NoSuchProcess:
            # Already dead: waitpid tells the node; watching a ghost would only kill nothing.
            log.info("watch_ignored_dead", worker=worker_id, worker_pid=pid)
            return False
        self._monitor.handle(Register(worker_id, pid, kind), self._clock())
        log.info("worker_watched", worker=worker_id, worker_pid=pid, kind=kind)
        return True

    async def _unwatch(self, payload: Any) -> bool:
        p = ControlPayload("unwatch", payload)
        worker_id, pid = p.require("worker_id", str), p.optional("pid", int)
        watched = self._procs.get(worker_id)
        # An unwatch for an old incarnation must not drop the watch of the new one.
        if watched is None or (pid is not None and watched[0].pid != int(pid)):
            return False
        del self._procs[worker_id]
        self._monitor.handle(Unregister(worker_id), self._clock())
        return True

    async def _status(self, _: Any) -> dict[str, Any]:
        stats = self._monitor.statistics(self._clock())
        received = self._receiver.statistics()
        host, port = self._receiver.address
        return {
            "pid": os.getpid(),
            "udp": f"{host}:{port}",
            "workers": {
                wid: {**asdict(w), "state": None if w.state is None else w.state.value}
                for wid, w in stats.workers.items()
            },
            "kills_by_reason": dict(stats.kills_by_reason),
            "ignored_beats": stats.ignored_beats,
            "beats_received": received.received,
            "beats_dropped": received.dropped,
            "beats_bad_mac": received.bad_mac,  # of the dropped: unsigned or not this cluster's
        }


def _bind_receiver(port: int) -> HeartbeatReceiver:
    try:
        return HeartbeatReceiver("127.0.0.1", port)
    except OSError as exc:
        if port == 0:
            raise
        # The old port is taken: the node tells the running workers the new one.
        log.warning("heartbeat_port_taken", port=port, error=str(exc))
        return HeartbeatReceiver("127.0.0.1", 0)


def _codec() -> Codec:
    """The supervisor's codec: it hosts no actors (a peer's tensor must not make it import
    torch) and its limits are no option a user could raise."""
    return Codec(node_limits=False, no_extension_imports="supervisor")


async def serve_supervisor(spec: SupervisorLaunch) -> None:
    """Run the supervisor until SIGTERM or Ctrl-C."""
    receiver = _bind_receiver(spec.udp_port)
    try:
        runtime = process_runtime(
            spec.node,
            "supervisor",
            codec=_codec(),
            drain_timeout=0.5,
        )
        stop = anyio.Event()
        async with runtime:
            supervisor = Supervisor(spec, runtime, receiver)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_on_signal, stop)
                await supervisor.run(stop)
                tg.cancel_scope.cancel()
    finally:
        receiver.close()
    log.info("supervisor_stopped")


async def _stop_on_signal(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            stop.set()
            break


def main() -> None:
    """Entry point of ``python -m troupe.runtime.supervision.supervisor``."""
    die_with_parent()
    spec = load_launch_spec(
        SupervisorLaunch,
        SPEC_ENV,
        "supervisor",
        "the supervisor is started by its node (`troupe node start`)",
    )
    name_process(f"troupe supervisor (node {spec.node})", "troupe-sup")
    configure_logging(
        spec.node,
        "supervisor",
        spec.log_dir,
        console=False,
        level=spec.log_level,
        rotate_at_bytes=spec.log_max_bytes,
        keep=spec.log_keep,
    )
    try:
        install_from_env()  # the node's keys, if it has any
        anyio.run(serve_supervisor, spec, backend="asyncio", backend_options={"use_uvloop": True})
    except ConfigError as exc:
        log.error("supervisor_config_error", error=str(exc))
        sys.exit(f"supervisor: {exc}")


if __name__ == "__main__":
    run_and_exit(main)  # no module teardown: its node, stopping, waits for this exit
