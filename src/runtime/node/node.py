"""The node: one per host. It owns the host's worker processes and answers control messages.

The node runs a runtime of its own (process name ``node``) bound at the node endpoint. It
spawns workers as child processes, learns their mailboxes when they register, resolves names
for them, relays control messages, and notices a worker's death from the process itself
(``wait``), not from a missed heartbeat. Shutdown: SIGTERM every worker, wait ``stop_grace_s``,
SIGKILL what is left, reap everything, exit.

A ``stop_worker`` of a worker the node has not started yet stops its start (``pending_starts.py``);
one that names another process than the worker's owner stops nothing (``stop_owners.py``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import anyio
import psutil

from troupe.runtime.core.control_payloads import (
    ControlPayload,
    address_field,
    clipped,
    validated,
)
from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.core.throttle import PeerThrottle
from troupe.runtime.errors import ActorStopped, AskTimeout, BadRequest, ConfigError, UnknownActor, Unreachable
from troupe.runtime.library_logging import get_logger
from troupe.runtime.log_publisher import LogPublisher
from troupe.runtime.logs import log_file
from troupe.runtime.metrics.serving import serving
from troupe.runtime.process_identity import process_identity, user_name
from troupe.runtime.security.process import (
    install,
    keys_for,
    security_status,
    warn_if_insecure,
    warn_if_not_own,
)
from troupe.runtime.start_limits import start_failure
from troupe.runtime.supervision.node_side import NodeSupervision
from troupe.runtime.transports.loopback import bind_or_move
from troupe.runtime.wire.codec import Codec

from .config import ActorSpec, NodeConfig, WorkerSpec
from .leftovers import ChildRecord, reap_predecessors
from .master_link import MasterLink, resolve_through_master
from .own_processes import is_own_descendant
from .pending_starts import PendingStart
from .reach import worker_bind
from .spawn_owners import OwnerWatch
from .stop_owners import heeds, not_its_owner
from .template_link import TemplateLink, spec_classes
from .worker_descendants import kill_group, kill_what_is_left, note_descendants
from .worker_handles import START_FAILED, HandleState, WorkerHandle, launch_worker
from .worker_process import ignore_stop_signals

__all__ = ["Node", "bind_refused"]

log = get_logger(__name__)

# Records of workers started on request (``spawn_worker``: a pipeline's replicas) and stopped
# since, that a node keeps for ``ctl status``: a node serving run after run forgets the oldest.
KEEP_STOPPED_SPAWNED = 64


class Node:
    """A host's node process.

    Args:
        config: the validated node config.
        handle_signals: stop on SIGTERM or Ctrl-C. False where the program owns the signals
            (the ``troupe`` command): it cancels :meth:`run` instead, which stops the same way.
        reap_orphans: the process is the node's alone (``troupe node start``): reap the zombies
            it adopts from dead workers (``orphans``). Off where the process has children of its
            own to wait for (a test, a program running a node inside it).
        template: a template already started for this node's workers (a run starts its own
            first, to check the stage classes while it imports them): the node forks from it
            and stops it, whatever ``fast_start`` says.
    """

    def __init__(
        self,
        config: NodeConfig,
        handle_signals: bool = True,
        reap_orphans: bool = False,
        template: TemplateLink | None = None,
    ) -> None:
        self.config = config
        self.handle_signals = handle_signals
        self.reap_orphans = reap_orphans
        self.name = config.name
        self.workers: dict[str, WorkerHandle] = {}
        self._launching: set[WorkerHandle] = set()  # a launch under way: its process may come yet
        self._pending_starts: set[PendingStart] = set()  # spawn requests not started yet (module)
        # Workers a master's drain stopped: their records stay, an undrain starts them again.
        self.drained: set[str] = set()
        self.runtime: Runtime | None = None
        self.master_link: MasterLink | None = None  # with a master: its beats, worker exits, drains
        self.log_publisher: LogPublisher | None = None  # the node's log stream, once it serves
        # More Prometheus collectors for the node's metrics endpoint: a master in this process.
        self.metrics_collectors: list[Any] = []
        self.started_at = time.time()  # a timestamp; uptime_s is measured on the monotonic clock
        self._started_mono = time.monotonic()
        self.stopping = anyio.Event()
        self.ready = anyio.Event()
        self.stopped = anyio.Event()  # set once every worker has been stopped and reaped
        self.refused: ConfigError | None = None  # why the master refused this node (refuse())
        # Extra sections of the status reply, by name (a pipeline driven beside this node).
        self.status_extras: dict[str, Callable[[], Any]] = {}
        # Called as listener(handle, reason) after every worker exit, before any restart
        # (handle.state is STOPPED for a stop on purpose); the task layer requeues there.
        self.worker_exit_listeners: list[Callable[[WorkerHandle, str], None]] = []
        self.supervision = NodeSupervision(self)
        self.children = ChildRecord(config.log_dir, self.name)  # for a successor, if we die hard
        # Workers start as forks of it (fast_start, or one given); None: each is spawned.
        self.template: TemplateLink | None = template
        self._tg: anyio.abc.TaskGroup | None = None  # the serving node's: workers, their watches
        # The endpoint is a default found free a moment ago: taken meanwhile, the node binds a
        # free port of the same host instead (``config.endpoint`` then says which).
        self.endpoint_may_move = False

    async def run(self) -> None:
        """Serve until SIGTERM, Ctrl-C, a ``shutdown`` control message or cancellation.

        Every way out is the same graceful stop: the workers first (SIGTERM, ``stop_grace_s``,
        SIGKILL, reaped), then the supervisor, then the node itself. A cancellation does not
        cut that stop short (a worker whose wait was cancelled would never be reaped): it asks
        for the stop, and the call returns once the stop is done.
        """
        failure: list[BaseException] = []
        async with anyio.create_task_group() as tg:

            async def serve() -> None:
                try:
                    with anyio.CancelScope(shield=True):
                        await self._serve()
                except BaseException as exc:  # raised below as it is, not wrapped in a group
                    failure.append(exc)
                finally:
                    tg.cancel_scope.cancel()

            tg.start_soon(serve)
            try:
                await anyio.sleep_forever()
            finally:
                self.stopping.set()
        if failure:
            raise failure[0]

    def _bind(self, endpoint: str) -> Runtime:
        cfg = self.config
        return process_runtime(
            self.name,
            "node",
            bind=endpoint,
            hwm=cfg.hwm,
            codec=Codec(int(cfg.max_message_mb * 1024 * 1024), cfg.max_frames, no_extension_imports="node"),
            throttle=PeerThrottle(cfg.bad_frames_burst, cfg.bad_frames_per_s, cfg.throttle_s),
            ask_timeout=cfg.ask_timeout_s,
            drain_timeout=cfg.drain_timeout_s,
        )

    async def _serve(self) -> None:
        cfg = self.config
        # Keys first: every socket of this process and of its children uses them (or none does).
        install(keys_for(cfg.keys) if cfg.keys is not None else None)
        worker_bind(cfg.endpoint, cfg.advertise)  # a wildcard endpoint needs advertise: say so now
        metrics = None
        if cfg.metrics is not None:  # bound first: a port in use stops the start, as the endpoint's
            from troupe.runtime.metrics.endpoints import node_endpoint  # prometheus-client: only now

            metrics = node_endpoint(self, cfg.metrics, self.metrics_collectors)
        try:
            runtime, moved = bind_or_move(self._bind, cfg.endpoint, self.endpoint_may_move)
        except Unreachable as exc:
            if metrics is not None:
                metrics.close()
            raise bind_refused(exc) from None
        if moved:
            log.warning("endpoint_taken", wanted=cfg.endpoint, endpoint=runtime.address)
            self.config = cfg = cfg.model_copy(update={"endpoint": runtime.address})
        self.runtime = runtime
        self.owners = OwnerWatch(runtime, self.workers, self._stop_named, master=cfg.master)
        self._install_controls(runtime)
        # A predecessor that died hard may have left processes behind: they go before ours start.
        await anyio.to_thread.run_sync(reap_predecessors, cfg.log_dir, self.name)
        # The log stream starts before the node logs that it started: from here on every line
        # of the node's processes is streamed (the file has what came before).
        self.log_publisher = LogPublisher(
            self.name,
            log_file(cfg.log_dir, self.name),
            worker_bind(cfg.endpoint, cfg.advertise),
            cfg.advertise,
            max_bytes=cfg.log_max_bytes,
            keep=cfg.log_keep,
        )
        served = False  # to the end of a stop, not out through an error
        try:
            self.children.claim()  # the name and log directory are in use: another node is refused
            async with serving(metrics), runtime:
                log.info("node_started", endpoint=runtime.address, workers=len(cfg.workers))
                for ignored in cfg.ignored_settings():
                    log.warning("config_setting_ignored", problem=ignored)
                warn_if_insecure(cfg.endpoint, cfg.insecure)
                warn_if_not_own()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.log_publisher.run)  # closed below, after node_stopped
                    if self.handle_signals:
                        tg.start_soon(self._stop_on_signal)
                    try:
                        await self.supervision.start(tg)
                        if self.template is not None:
                            self.template.adopt(self.children.add)
                        elif cfg.fast_start:
                            self.template = TemplateLink(
                                self.name,
                                [*cfg.preload, *spec_classes(cfg.workers)],
                                self.children.add,
                                reap_orphans=self.reap_orphans,
                            )
                            await self.template.start(tg)
                        if cfg.master:  # task dispatch: beat to the master, report worker exits
                            self.master_link = MasterLink(
                                self, cfg.master, log_endpoint=self.log_publisher.endpoint
                            )
                            tg.start_soon(self.master_link.run)
                        for spec in cfg.workers:
                            self.start_worker(tg, spec)
                        self._tg = tg
                        tg.start_soon(self.owners.run)
                        self.ready.set()
                        await self.stopping.wait()
                    finally:  # asked to stop, or failed: the workers go first, either way
                        self.stopping.set()  # from here on nothing is restarted
                        async with anyio.create_task_group() as stops:
                            # Both go while the workers do, their exits off the stop's critical
                            # path: the template forks nothing more (a launch now spawns), and
                            # the node's own grace and SIGKILL end a worker that hangs now.
                            if self.template is not None:
                                stops.start_soon(self.template.stop)
                            stops.start_soon(self.supervision.stop)
                            await self._stop_workers()
                        if self.master_link is not None:  # after its workers: none reports after it
                            await self.master_link.leave()
                        tg.cancel_scope.cancel()
            served = True
        finally:
            self.children.close()
            if served:  # before the stream closes: its last line, which a tail sees
                log.info("node_stopped")
            self.log_publisher.close()  # it publishes what the file got since its last poll: the stop
            self.stopped.set()
        if self.refused is not None:  # its master refused it: the stop was the refusal's
            raise self.refused

    @property
    def uptime_s(self) -> float:
        """Seconds since the node was made, on the monotonic clock: a step of the wall clock
        (NTP at boot) makes it neither negative nor an hour too long."""
        return time.monotonic() - self._started_mono

    def refuse(self, error: ConfigError) -> None:
        """Stop, as any stop goes, then raise ``error`` from :meth:`run`: the master refused this
        node (another node runs under its name)."""
        self.refused = error
        self.stopping.set()

    def retire_template(self) -> None:
        """Stop the template now, its exit off the node's own stop: the workers that the node
        will start soon have started (a run's items have all ended). A worker started later is
        spawned, as on a node without a template."""
        if self.template is not None and self._tg is not None:
            self._tg.start_soon(self.template.stop)

    # -- workers ------------------------------------------------------------------------------

    def start_worker(
        self, tg: anyio.abc.TaskGroup, spec: WorkerSpec, restart_reason: str | None = None
    ) -> WorkerHandle:
        """Start the worker ``spec`` in ``tg``, reusing its handle if the node has one (a restart
        passes the reason its actors get in ``restarted``); the node then supervises it."""
        handle = self.workers.get(spec.name)
        if handle is None:
            handle = WorkerHandle(spec)
            self.workers[spec.name] = handle
        handle.stop_asked = False
        tg.start_soon(self._supervise, handle, restart_reason)
        return handle

    async def _supervise(self, handle: WorkerHandle, restart_reason: str | None) -> None:
        assert self.runtime is not None
        cfg = self.config
        self._launching.add(handle)
        try:
            proc = await launch_worker(
                handle,
                self.name,
                self.runtime.address,
                cfg,
                restart_reason,
                self.supervision.launch_options(handle),
                self.template,
            )
        except (OSError, RuntimeError) as exc:
            # A fork refused (a process or memory limit reached, for a moment perhaps): a
            # failed start of this worker, under the restart policy. Raised, it ended the node
            # and every healthy worker with it.
            error = start_failure(exc)
            if error is None:
                raise
            handle.start_failed(error)
            log.warning("worker_start_failed", worker=handle.spec.name, error=error)
            self.on_worker_exit(handle)
            return
        finally:
            self._launching.discard(handle)
        self.children.add(proc.pid, f"worker {handle.spec.name}")
        if handle.stop_asked or self.stopping.is_set():  # stopped while it was being started
            _signal(handle, signal.SIGTERM)
        log.info(
            "worker_spawned", worker=handle.spec.name, worker_pid=proc.pid, incarnation=handle.incarnation
        )
        self.supervision.worker_launched(handle)  # a start that hangs is killed, not left "starting"
        code = await handle.wait()  # also passes its stderr on and keeps its last error
        await kill_what_is_left(handle)  # of a stop: what it started is not left running
        await kill_group(handle)  # however it ended: what is left in its process group
        mailboxes = {e for e in (handle.endpoint, *handle.actors.values()) if e}
        handle.exited(code)
        # Nobody listens there now: a restart binds anew (and registers), a stopped replica is
        # gone for good. Each connection holds a socket and its monitor's (three descriptors): a
        # node serving run after run, each with replicas of new names, ran out of them.
        for endpoint in mailboxes:
            self.runtime.transport.forget(endpoint)
        log.log(
            20 if handle.state is HandleState.STOPPED else 30,
            "worker_exited",
            worker=handle.spec.name,
            worker_pid=proc.pid,
            returncode=code,
            reason=handle.exit_reason,
            **({"error": handle.exit_error} if handle.exit_error else {}),
        )
        self.on_worker_exit(handle)

    def on_worker_exit(self, handle: WorkerHandle) -> None:
        """Called when a worker process has exited and been reaped (restart policy hook)."""
        self.supervision.worker_exited(handle)

    async def _stop_workers(self) -> None:
        # A worker whose restart was under way when the stop began shows up on a later pass:
        # each pass first lets the launches under way end (they are told to stop as they do),
        # so that none makes a process after the last pass looked (it outlived its node).
        for _ in range(3):
            with anyio.move_on_after(self.config.stop_grace_s):
                while self._launching:
                    await anyio.sleep(0.01)
            live = [h for h in self.workers.values() if h.process is not None and h.returncode is None]
            if not live:
                if self._launching:
                    log.warning(
                        "worker_launch_outlasted_stop", workers=sorted(h.spec.name for h in self._launching)
                    )
                return
            await self._stop_these(live)

    async def _stop_these(self, live: list[WorkerHandle]) -> None:
        for handle in live:
            handle.state = HandleState.STOPPING
        await note_descendants(live)
        for handle in live:
            _signal(handle, signal.SIGTERM)
        with anyio.move_on_after(self.config.stop_grace_s):
            for handle in live:
                await handle.exited_event.wait()
        await note_descendants(live)  # those still running: what the stop has started since
        for handle in live:
            if handle.returncode is None:
                log.warning("worker_kill_after_grace", worker=handle.spec.name, worker_pid=handle.pid)
                _signal(handle, signal.SIGKILL)
        with anyio.move_on_after(5.0):
            for handle in live:
                await handle.exited_event.wait()

    # -- control messages ---------------------------------------------------------------------

    def _install_controls(self, runtime: Runtime) -> None:
        runtime.register_controls(
            dict(
                ping=self._ping,
                status=self._status,
                register=self._register,
                resolve=self._resolve,
                actor_spawned=self._actor_spawned,
                spawn_worker=self._spawn_worker,
                stop_worker=self._stop_worker,
                shutdown=self._shutdown,
                log_recent=self._log_recent,
            )
        )
        self.supervision.install(runtime)

    async def _log_recent(self, payload: Any) -> dict[str, Any]:
        if self.log_publisher is None:
            raise ActorStopped(f"node {self.name} is not streaming its log yet")
        return self.log_publisher.answer(payload)

    async def _ping(self, _: Any) -> dict[str, Any]:
        return {
            "node": self.name,
            "pid": os.getpid(),
            "time": time.time(),
            "process": process_identity(),
            "user": user_name(),
        }

    async def _register(self, payload: Any) -> bool:
        p = ControlPayload("register", payload)
        process, endpoint = p.require("process", str), p.require("endpoint", str)
        pid, actors = p.require("pid", int), p.map_of_str("actors")
        handle = self.workers.get(process)
        if handle is None:
            raise UnknownActor(f"no worker named {process!r} was started by node {self.name}")
        if not is_own_descendant(pid):  # its supervisor would kill whatever process it names
            log.warning("register_refused", worker=process, worker_pid=pid, endpoint=endpoint)
            raise BadRequest(f"control 'register': pid {pid} is not a process that node {self.name} started")
        handle.registered(endpoint, pid, actors)
        log.info(
            "worker_registered", worker=handle.spec.name, endpoint=handle.endpoint, worker_pid=handle.pid
        )
        self.supervision.worker_registered(handle)
        assert self.runtime is not None
        key = f"{self.name}/{handle.spec.name}"
        for old in self.runtime.directory.forget_process(key):
            self.runtime.transport.forget(old)
        self.runtime.directory.learn(key, handle.endpoint or "")
        self._announce(handle)
        return True

    async def _actor_spawned(self, payload: Any) -> bool:
        """A worker started an actor on request (its ``spawn`` control): name it in the
        directory, tell the other workers, and add it to the worker's spec, so that a restart of
        the worker brings it back."""
        assert self.runtime is not None
        p = ControlPayload("actor_spawned", payload)
        process, endpoint = p.require("process", str), p.require("endpoint", str)
        actor = validated(ActorSpec, p.require("actor", dict), "actor_spawned", "actor")
        handle = self.workers.get(process)
        if handle is None:
            raise UnknownActor(f"no worker named {process!r} was started by node {self.name}")
        if all(a.name != actor.name for a in handle.spec.actors):
            handle.spec = handle.spec.model_copy(update={"actors": (*handle.spec.actors, actor)})
        handle.actors[actor.name] = endpoint
        self.runtime.directory.learn(f"{self.name}/{handle.spec.name}/{actor.name}", endpoint)
        log.info("actor_spawned", worker=handle.spec.name, actor=actor.name, cls=actor.cls)
        self._announce(handle)
        if self.master_link is not None:
            # Before the worker answers its spawn: a peer of another node that is told of the
            # actor asks the master where it listens, which knew of it only from the next beat.
            await self.master_link.beat_now()
        return True

    def _announce(self, handle: WorkerHandle) -> None:
        """Push a worker's endpoints to the other running workers (``directory_update``)."""
        assert self.runtime is not None
        update = {
            "key": f"{self.name}/{handle.spec.name}",
            "endpoint": handle.endpoint,
            "actors": handle.actors,
        }
        for other in self.workers.values():
            if other is not handle and other.state is HandleState.RUNNING and other.endpoint:
                self.runtime.start_soon(self._notify, other.endpoint, update)

    async def _notify(self, endpoint: str, update: dict[str, Any]) -> None:
        assert self.runtime is not None
        try:
            await self.runtime.control(endpoint, "directory_update", update, timeout=2.0)
        except Exception as exc:  # a peer that is itself restarting learns on register
            log.info("directory_update_failed", endpoint=endpoint, error=repr(exc))

    async def _resolve(self, payload: Any) -> dict[str, str]:
        assert self.runtime is not None
        # The forms of docs/PROTOCOL.md section 10: ACTOR, PROCESS/ACTOR, NODE/PROCESS/ACTOR;
        # `node` and NODE/node name the node process itself, node/ACTOR an actor it hosts.
        addr = address_field(ControlPayload("resolve", payload), "address")
        try:
            return self._resolve_here(addr)
        except (UnknownActor, Unreachable) as here:
            if not self.config.master:
                raise
            local = here
        # Another host's actor: the master is the cluster's directory (its nodes' beats).
        try:
            return await resolve_through_master(self.runtime, self.config.master, addr, timeout=3.0)
        except (AskTimeout, Unreachable, ActorStopped) as exc:
            raise type(local)(f"{local}; nor can the master at {self.config.master} say ({exc})") from None

    def _resolve_here(self, addr: ActorAddress) -> dict[str, str]:
        assert self.runtime is not None
        if addr.node and addr.node != self.name:
            raise Unreachable(
                f"node {self.name} cannot resolve {addr.shown()}: node {clipped(addr.node)} is not this one"
            )
        if addr.actor == "node" and not addr.node and addr.process in ("", self.name):
            return {"address": f"{self.name}/node", "endpoint": self.runtime.address}
        if addr.process == "node":
            cell = self.runtime.cells.get(addr.actor)
            if cell is None:
                raise UnknownActor(
                    f"the node process of {self.name} hosts no actor {clipped(addr.actor)}; "
                    "resolve `node` for the node's own mailbox"
                )
            return {"address": f"{self.name}/node/{addr.actor}", "endpoint": cell.endpoint}
        for handle in self.workers.values():
            if handle.state is not HandleState.RUNNING or not handle.endpoint:
                continue
            if handle.process is not None and handle.process.returncode is not None:
                continue  # reaped, its stderr and leftovers not yet seen to: nobody listens there
            if (addr.process == handle.spec.name or not addr.process) and addr.actor in handle.actors:
                return {
                    "address": f"{self.name}/{handle.spec.name}/{addr.actor}",
                    "endpoint": handle.actors[addr.actor],
                }
        raise UnknownActor(f"no running actor {addr.shown()} on node {self.name}; see `troupe ctl status`")

    async def _status(self, payload: Any) -> dict[str, Any]:
        assert self.runtime is not None
        workers = []
        for handle in list(self.workers.values()):  # workers may start while it awaits
            info = handle.describe()
            info["rss_mib"] = _rss_mib(handle.pid) if handle.returncode is None else 0.0
            if handle.state is HandleState.RUNNING and handle.endpoint:
                try:
                    info["runtime"] = await self.runtime.control(handle.endpoint, "status", timeout=1.0)
                except Exception as exc:
                    info["runtime"] = {"error": repr(exc)}
            workers.append(info)
        return {
            "node": self.name,
            "pid": os.getpid(),
            # Whose node: two users' runs' nodes on one host are both called ``local``.
            "user": user_name(),
            "uid": os.getuid(),
            "endpoint": self.runtime.address,
            "tags": list(self.config.tags),
            "log_endpoint": self.log_publisher.endpoint if self.log_publisher is not None else None,
            "security": security_status(self.config.insecure),
            "uptime_s": round(self.uptime_s, 3),
            "rss_mib": _rss_mib(os.getpid()),
            "workers": workers,
            "runtime": asdict(self.runtime.statistics()),
            "supervision": await self.supervision.describe(),
            "template": self.template.describe() if self.template is not None else None,
            **{name: extra() for name, extra in self.status_extras.items()},
        }

    async def _spawn_worker(self, payload: Any) -> dict[str, Any]:
        p = ControlPayload("spawn_worker", payload)
        timeout_s = float(p.optional("timeout_s", float, 30.0))
        owner = p.optional("owner", str, None)
        owner_process = p.optional("owner_process", str, "")
        fields = {k: v for k, v in p.fields.items() if k not in ("timeout_s", "owner", "owner_process")}
        spec = validated(WorkerSpec, fields, "spawn_worker")
        if self.stopping.is_set():  # a worker started now could outlive the stop's last look
            raise ActorStopped(f"node {self.name} is stopping; it starts no worker")
        pending = PendingStart(spec.name, owner, owner_process)
        self._pending_starts.add(pending)
        try:
            await self._free_the_name(spec, owner, timeout_s, pending)
            if pending.stopped.is_set():  # its requester ended while the node waited: not started
                log.info("spawn_stopped_before_start", worker=spec.name, owner=owner)
                raise ActorStopped(
                    f"worker {spec.name!r} was stopped (stop_worker) before node {self.name} started it; "
                    "it starts no worker"
                )
            if self.stopping.is_set():
                raise ActorStopped(f"node {self.name} is stopping; it starts no worker")
            self._forget_stopped_spawned(KEEP_STOPPED_SPAWNED - 1)
            if self._tg is None:  # its controls answer a moment before it serves
                raise ActorStopped(f"node {self.name} is still starting; it starts no worker yet")
            handle = self.start_worker(self._tg, spec)  # from here on a stop finds its handle
        finally:
            self._pending_starts.discard(pending)
        handle.fail_fast = True
        handle.spawned = True
        handle.owner = owner
        handle.owner_process = owner_process
        with anyio.move_on_after(timeout_s):
            async with anyio.create_task_group() as tg:

                async def first(event: anyio.Event) -> None:
                    await event.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(first, handle.ready_event)
                tg.start_soon(first, handle.exited_event)
        if handle.ready_event.is_set():
            if self.master_link is not None:
                # The requester passes the worker's name on at once (a run's engine tells the
                # replicas pulling from it), and a process of another node, of an older troupe
                # too, asks the master where it listens: the master must know it before anyone
                # is told of it, not from the node's next beat, up to a second later.
                await self.master_link.beat_now()
            return {**handle.describe(), "node": self.name}
        if not handle.exited_event.is_set():  # neither: stop it, or it would start unasked later
            with contextlib.suppress(UnknownActor):  # it exited meanwhile
                await self._stop_running(spec.name)
            raise AskTimeout(
                f"worker {spec.name!r} did not start within {timeout_s:g} s on node {self.name}; "
                f"see the node's log ({handle.last_error or 'it wrote no error'})"
            )
        if self.stopping.is_set():  # the node's stop ended it: a start elsewhere may pass
            raise ActorStopped(f"node {self.name} is stopping; it stopped worker {spec.name!r} as it started")
        if handle.exit_reason == START_FAILED:
            raise ConfigError(f"node {self.name} could not start worker {spec.name!r}: {handle.last_error}")
        raise ConfigError(
            f"worker {spec.name!r} exited while starting ({handle.exit_reason}): "
            f"{handle.last_error or 'it wrote no error; see the node log'}"
        )

    async def _free_the_name(
        self, spec: WorkerSpec, owner: str | None, timeout_s: float, pending: PendingStart
    ) -> None:
        """Make way for the requested worker ``spec``: stop the worker of the name whose owner
        is gone, wait for one being stopped; raise ConfigError when another runs it. Returns at
        once, having done nothing more, once ``pending`` is stopped."""
        existing = self.workers.get(spec.name)
        if (
            existing is not None
            and existing.returncode is None
            and existing.owner is not None
            and existing.owner != owner
            and await pending.unless_stopped(self.owners.gone, existing.owner, existing.owner_process)
        ):  # the replica of a run that was killed: its rerun takes the name
            log.warning("spawned_worker_owner_gone", worker=spec.name, owner=existing.owner)
            with contextlib.suppress(UnknownActor):
                await self._stop_running(spec.name)
        if pending.stopped.is_set():
            return
        if existing is not None and existing.state is HandleState.STOPPING and existing.returncode is None:
            # Being stopped (a cancelled run's replica, say): its name is free once it exited,
            # within the stop's grace and kill.
            with anyio.move_on_after(timeout_s):
                await pending.unless_stopped(existing.exited_event.wait)
        if pending.stopped.is_set():
            return
        if existing is not None and existing.returncode is None and existing.process is not None:
            by = f", started by {existing.owner} (another run of this pipeline?)" if existing.owner else ""
            raise ConfigError(f"a worker named {spec.name!r} already runs on node {self.name}{by}")
        if existing is not None and self.workers.get(spec.name) is existing:
            del self.workers[spec.name]

    def _forget_stopped_spawned(self, keep: int) -> None:
        """Forget the oldest records of spawned workers stopped on purpose beyond ``keep``: each
        run of a long-lived node spawns replicas anew, and the status would list them all."""
        stopped = [
            name
            for name, h in self.workers.items()
            if h.spawned and h.state is HandleState.STOPPED and name not in self.drained
        ]
        for name in stopped[: max(0, len(stopped) - keep)]:  # oldest first: dicts keep order
            del self.workers[name]

    async def _stop_worker(self, payload: Any) -> bool:
        """The ``stop_worker`` control: a start of the name the node has not made yet starts
        nothing now (see the module), and the running worker of the name is stopped."""
        p = ControlPayload("stop_worker", payload)
        name = p.require("name", str)
        owner_process = p.optional("owner_process", str, "")
        cancelled = [
            s for s in self._pending_starts if s.name == name and heeds(s.owner_process, owner_process)
        ]
        for pending in cancelled:
            pending.stopped.set()
        handle = self.workers.get(name)
        if handle is not None and not heeds(handle.owner_process, owner_process):
            if cancelled:  # the sender's start, not made: that was its worker
                return True
            raise not_its_owner(name, self.name, handle.owner_process, owner_process)
        try:
            return await self._stop_running(name)
        except UnknownActor:
            if cancelled:  # the requester's worker is stopped: it never started
                return True
            raise

    async def _stop_running(self, name: str) -> bool:
        """Stop the worker ``name`` (one being launched: once its process exists)."""
        handle = self.workers.get(name)
        if name in self.drained and handle is not None and handle.returncode is not None:
            # Stopped by a drain, now by its owner (the run that spawned it, which replaced it
            # elsewhere): an undrain must not start it again.
            self.drained.discard(name)
            return True
        if handle is None or handle.returncode is not None:
            raise UnknownActor(f"no running worker {name!r} on node {self.name}")
        handle.state = HandleState.STOPPING
        handle.stop_asked = True  # not launched yet (a run cancelled while it started it): once it is
        await note_descendants([handle])
        _signal(handle, signal.SIGTERM)
        with anyio.move_on_after(self.config.stop_grace_s):
            await handle.exited_event.wait()
        if handle.returncode is None:
            await note_descendants([handle])
            _signal(handle, signal.SIGKILL)
            await handle.exited_event.wait()
        return True

    async def _stop_named(self, name: str) -> bool:
        # The owner watch's stop of a gone owner's worker: a start of the name another owner
        # asked for meanwhile is not that owner's, and goes on.
        return await self._stop_running(name)

    async def _shutdown(self, _: Any) -> bool:
        self.stopping.set()
        return True

    async def _stop_on_signal(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("node_signal", signal=signal.Signals(signum).name)
                self.stopping.set()
                break
        ignore_stop_signals()


def _signal(handle: WorkerHandle, signum: signal.Signals) -> None:
    if handle.process is not None and handle.returncode is None:
        try:
            handle.process.send_signal(signum)
        except ProcessLookupError:
            pass


def _rss_mib(pid: int | None) -> float:
    if not pid:
        return 0.0
    try:
        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except psutil.Error:
        return 0.0


def bind_refused(exc: Unreachable) -> ConfigError:
    """The node's endpoint could not be bound: "another node" only for an address in use (an
    IPv6 one failed with "No such device", an address of another host with "Cannot assign
    requested address", and both were asked whether another node ran there)."""
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(f"{exc}; is another node already running there? pick --endpoint")
    return ConfigError(f"{exc}; pick another --endpoint (an address of this host)")
