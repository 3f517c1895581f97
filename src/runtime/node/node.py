"""The node: one per host. It owns the host's worker processes and answers control messages.

The node runs a runtime of its own (process name ``node``) bound at the node endpoint. It
spawns workers as child processes, learns their mailboxes when they register, resolves names
for them, relays control messages, and notices a worker's death from the process itself
(``wait``), not from a missed heartbeat. Shutdown: SIGTERM every worker, wait ``stop_grace_s``,
SIGKILL what is left, reap everything, exit.

A ``stop_worker`` of a worker the node has not started yet stops its start (``pending_starts.py``);
one that names another process than the worker's owner stops nothing (``stop_owners.py``).

:class:`Node` here is the node itself: what it holds, how it serves and stops, and the table of
its controls. Its parts, each a base class that uses the node's fields: ``worker_lifecycle``
(starting a worker, waiting for its exit, stopping one or all), ``spawn_controls`` (the
``spawn_worker`` and ``stop_worker`` controls, on the lifecycle), ``directory_controls``
(``register``, ``actor_spawned``, ``resolve``: where the actors listen) and ``status_controls``
(``ping``, ``status``, ``log_recent``: what the node says of itself).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime, process_runtime
from troupe.runtime.core.throttle import PeerThrottle
from troupe.runtime.errors import ConfigError, Unreachable
from troupe.runtime.library_logging import get_logger
from troupe.runtime.log_publisher import LogPublisher
from troupe.runtime.logs import log_file
from troupe.runtime.metrics.serving import serving
from troupe.runtime.security.process import (
    hand_down,
    install,
    keys_for,
    warn_if_insecure,
    warn_if_not_own,
    warn_of_unnamed_keys,
    withdraw,
)
from troupe.runtime.supervision.node_side import NodeSupervision
from troupe.runtime.transports.loopback import bind_or_move
from troupe.runtime.wire.codec import Codec

from .config import NodeConfig
from .directory_controls import DirectoryControls
from .leftovers import ChildRecord, keys_file, reap_predecessors
from .master_link import MasterLink
from .pending_starts import PendingStart
from .reach import worker_bind
from .spawn_controls import SpawnControls
from .spawn_owners import OwnerWatch
from .status_controls import StatusControls
from .template_link import TemplateLink, spec_classes
from .worker_handles import WorkerHandle
from .worker_process import ignore_stop_signals

__all__ = ["Node", "bind_refused"]

log = get_logger(__name__)


class Node(SpawnControls, DirectoryControls, StatusControls):
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
        snapshot = keys_file(cfg.log_dir, self.name, os.getpid())
        try:
            self.children.claim()  # the name and log directory are in use: another node is refused
            hand_down(snapshot)  # every child loads the keys of this start, however the directory changes
            async with serving(metrics), runtime:
                log.info("node_started", endpoint=runtime.address, workers=len(cfg.workers))
                for ignored in cfg.ignored_settings():
                    log.warning("config_setting_ignored", problem=ignored)
                warn_if_insecure(cfg.endpoint, cfg.insecure)
                warn_if_not_own()
                warn_of_unnamed_keys()
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
            withdraw(snapshot)
            if served:  # before the stream closes: its last line, which a tail sees
                log.info("node_stopped")
            self.log_publisher.close()  # it publishes what the file got since its last poll: the stop
            self.stopped.set()
        if self.refused is not None:  # its master refused it: the stop was the refusal's
            raise self.refused

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


def bind_refused(exc: Unreachable) -> ConfigError:
    """The node's endpoint could not be bound: "another node" only for an address in use (an
    IPv6 one failed with "No such device", an address of another host with "Cannot assign
    requested address", and both were asked whether another node ran there)."""
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(f"{exc}; is another node already running there? pick --endpoint")
    return ConfigError(f"{exc}; pick another --endpoint (an address of this host)")
