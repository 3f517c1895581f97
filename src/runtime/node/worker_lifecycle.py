"""A node's workers from start to exit: started (a fork of the template, or a spawn), waited on
until they exit and reaped, with what they left behind killed; stopped one at a time or all
together at the node's stop (SIGTERM, ``stop_grace_s``, then SIGKILL).

A fork the host refuses (a process or memory limit, for a moment perhaps) is a failed start of
that worker under its restart policy, not the node's end. A worker stopped while it was being
launched is told to stop as soon as its process exists (``stop_asked``), and the node's stop
lets the launches under way end first, so that none makes a process after the stop's last look.

:class:`WorkerLifecycle` is a part of :class:`~troupe.runtime.node.node.Node`: it uses the
node's fields.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import anyio

from troupe.runtime.errors import UnknownActor
from troupe.runtime.library_logging import get_logger
from troupe.runtime.start_limits import start_failure

from .worker_descendants import kill_group, kill_what_is_left, note_descendants
from .worker_handles import HandleState, WorkerHandle, launch_worker

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime
    from troupe.runtime.supervision.node_side import NodeSupervision

    from .config import NodeConfig, WorkerSpec
    from .leftovers import ChildRecord
    from .template_link import TemplateLink

__all__ = ["WorkerLifecycle"]

log = get_logger(__name__)


class WorkerLifecycle:
    """Starts the node's workers, waits for their exits, stops them (a part of the node)."""

    config: NodeConfig
    name: str
    runtime: Runtime | None
    workers: dict[str, WorkerHandle]
    drained: set[str]  # workers a master's drain stopped
    stopping: anyio.Event
    supervision: NodeSupervision
    children: ChildRecord
    template: TemplateLink | None
    _launching: set[WorkerHandle]  # a launch under way: its process may come yet

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


def _signal(handle: WorkerHandle, signum: signal.Signals) -> None:
    if handle.process is not None and handle.returncode is None:
        try:
            handle.process.send_signal(signum)
        except ProcessLookupError:
            pass
