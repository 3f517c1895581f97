"""The controls that start and stop a node's workers on request: ``spawn_worker`` (a pipeline's
replicas, each owned by the run that asked) and ``stop_worker``.

A requested worker takes the name of a worker that exited, or that is being stopped (once it
exits), or whose owner is gone (a killed run's replica: it is stopped, and its rerun takes the
name); while any other worker of the name runs, the request is refused. A ``stop_worker`` of a
start the node has not made yet cancels it (``pending_starts.py``); one that names another
process than the worker's owner stops nothing (``stop_owners.py``). A long-lived node keeps the
records of the last ``KEEP_STOPPED_SPAWNED`` spawned workers it stopped, for ``ctl status``.

:class:`SpawnControls` is a part of :class:`~troupe.runtime.node.node.Node`, on its workers'
lifecycle (``worker_lifecycle.py``): it uses the node's fields.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio

from troupe.runtime.core.control_payloads import ControlPayload, validated
from troupe.runtime.errors import ActorStopped, AskTimeout, ConfigError, UnknownActor
from troupe.runtime.library_logging import get_logger

from .config import WorkerSpec
from .pending_starts import PendingStart
from .stop_owners import heeds, not_its_owner
from .worker_handles import START_FAILED, HandleState
from .worker_lifecycle import WorkerLifecycle

if TYPE_CHECKING:
    from .master_link import MasterLink
    from .spawn_owners import OwnerWatch

__all__ = ["KEEP_STOPPED_SPAWNED", "SpawnControls"]

log = get_logger(__name__)

# Records of workers started on request (``spawn_worker``: a pipeline's replicas) and stopped
# since, that a node keeps for ``ctl status``: a node serving run after run forgets the oldest.
KEEP_STOPPED_SPAWNED = 64


class SpawnControls(WorkerLifecycle):
    """Answers ``spawn_worker`` and ``stop_worker`` (a part of the node)."""

    master_link: MasterLink | None
    owners: OwnerWatch
    _pending_starts: set[PendingStart]  # spawn requests not started yet
    _tg: anyio.abc.TaskGroup | None  # the serving node's: workers, their watches

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

    async def _stop_named(self, name: str) -> bool:
        # The owner watch's stop of a gone owner's worker: a start of the name another owner
        # asked for meanwhile is not that owner's, and goes on.
        return await self._stop_running(name)
