"""Where the actors of a node listen: the controls ``register`` (a worker's mailboxes, as it
starts), ``actor_spawned`` (an actor a worker started on request) and ``resolve`` (an address to
its endpoint).

The node learns each worker's endpoints into its runtime's directory and pushes them to its other
running workers (``directory_update``). ``resolve`` answers from the node's own workers and the
node process; another host's actor is the master's to say, which knows every node's from their
beats (``master_link.resolve_through_master``).

:class:`DirectoryControls` is a part of :class:`~troupe.runtime.node.node.Node`: it uses the
node's fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from troupe.runtime.core.control_payloads import ControlPayload, address_field, clipped, validated
from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.errors import ActorStopped, AskTimeout, BadRequest, UnknownActor, Unreachable
from troupe.runtime.library_logging import get_logger

from .config import ActorSpec
from .master_link import resolve_through_master
from .own_processes import is_own_descendant
from .worker_handles import HandleState, WorkerHandle

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime
    from troupe.runtime.supervision.node_side import NodeSupervision

    from .config import NodeConfig
    from .master_link import MasterLink

__all__ = ["DirectoryControls"]

log = get_logger(__name__)


class DirectoryControls:
    """Answers ``register``, ``actor_spawned`` and ``resolve`` (a part of the node)."""

    config: NodeConfig
    name: str
    runtime: Runtime | None
    workers: dict[str, WorkerHandle]
    supervision: NodeSupervision
    master_link: MasterLink | None

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
