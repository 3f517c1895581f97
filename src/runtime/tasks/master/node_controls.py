"""What the nodes tell the master: their beats, the directory lookups they make (``resolve``),
and the beats of the runs that own replicas on them (``owner_beat``, ``owner_seen``,
``owner_gone``).

:class:`NodeControls` is the part of :class:`~troupe.runtime.tasks.master.master.Master` that
answers them at once, from its node table (``nodes.py``) and its run owners (``run_owners.py``);
none of them goes through the driver or the journal. A node declared dead (``node_dead``, or
silent too long) is the master's own business: its workers' tasks go back through the driver.

A beat from another process than the one the master has under the node's name, at another
endpoint, while that node is alive, waits for a ping of that node: if it answers under the name,
the beat is refused (``NameTaken``: the second node stops, exit 2); if not, the name passes to
the new process (a node started again elsewhere before its last beat went stale).

A beat that says the node is drained, to a master that does not have it draining (it
restarted, or declared the node dead meanwhile), drains it there too (through the driver, as
``troupe ctl drain``): the node runs none of its workers, and ``ctl status`` says why. A beat
sent before the node took the master's last ``master_undrained`` does not (``NodeTable.says_drained``),
nor one of a node owed an undrain (ended while it was stopped, dead or silent: ``undrain.py``):
that node is told the undrain instead, once (a beat at a time until it takes it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from troupe.runtime.core.router import Answer
from troupe.runtime.errors import NameTaken, TroupeError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.state import DrainNode

from .controls import NodeBeatControl, OwnerControl, ResolveControl
from .nodes import ProcessEntry
from .undrain import tell_undrained

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime
    from troupe.runtime.tasks.book import TaskBook

    from .driver import Dispatcher
    from .master_config import MasterConfig
    from .nodes import NodeInfo, NodeTable
    from .run_owners import RunOwners

__all__ = ["NodeControls"]

log = get_logger(__name__)

HOLDER_PING_S = 1.0
"""How long the node that has a name may take to answer, when another process beats under it."""


class NodeControls:
    """Answers the nodes' beats and lookups, and the run owners' beats (a part of the master)."""

    config: MasterConfig
    nodes: NodeTable
    run_owners: RunOwners
    clock: Callable[[], float]
    book: TaskBook
    dispatcher: Dispatcher
    runtime: Runtime | None
    _asking: set[asyncio.Task[bool]]  # the pings of names' holders under way
    _drains_told: set[str]  # nodes whose beat said drained, the drain not landed yet
    _undrains_telling: set[str]  # nodes owed an undrain, being told it now

    def _owner_beat(self, payload: Any) -> Answer:
        self.run_owners.beat(OwnerControl.decode("owner_beat", payload).owner)
        return Answer.now(True)

    def _owner_gone(self, payload: Any) -> Answer:
        self.run_owners.gone(OwnerControl.decode("owner_gone", payload).owner)
        return Answer.now(True)

    def _owner_seen(self, payload: Any) -> Answer:
        owner = OwnerControl.decode("owner_seen", payload).owner
        owners = self.run_owners
        return Answer.now({"silent_s": owners.silent_s(owner), "heard": owners.heard(owner)})

    def _node_beat(self, payload: Any) -> Answer:
        m = NodeBeatControl.decode(payload)
        held = self.nodes.contended(m.node, m.endpoint, m.process)
        if held is None or self.runtime is None:
            return Answer.now(self._take_beat(m))
        # Another process beats under the name of a live node: two nodes started under one
        # name (the CLI's own look finds none when both start at once), or a node started
        # again at another endpoint while its last beats are recent. The holder's answer tells.
        asked = asyncio.get_running_loop().create_task(self._holder_answers(held, m.process))
        self._asking.add(asked)
        asked.add_done_callback(self._asking.discard)

        def decided(answered: bool) -> dict[str, Any]:
            if answered and self.nodes.contended(m.node, m.endpoint, m.process) is held:
                log.warning("node_name_taken", node=m.node, endpoint=m.endpoint, holder=held.endpoint)
                raise NameTaken(
                    f"node name {m.node!r} is taken: the node at {held.endpoint} runs under it, "
                    "joined to this master; give this node another --name"
                )
            log.info("node_replaced", node=m.node, endpoint=m.endpoint, was=held.endpoint)
            return self._take_beat(m)

        return Answer(asked, decided)

    async def _holder_answers(self, held: NodeInfo, contender: str) -> bool:
        """Whether the node the master has under the name still runs there (a second process
        under its name is then refused), rather than the contender itself, or nobody."""
        assert self.runtime is not None
        try:
            reply = await self.runtime.control(held.endpoint, "ping", None, timeout=HOLDER_PING_S)
        except Exception:  # gone, or not answering: the name is the contender's
            return False
        named = isinstance(reply, dict) and reply.get("node") == held.node
        return named and reply.get("process") != contender

    def _take_beat(self, m: NodeBeatControl) -> dict[str, Any]:
        processes = (
            None
            if m.processes is None
            else {name: ProcessEntry(endpoint, actors) for name, (endpoint, actors) in m.processes.items()}
        )
        if self.nodes.beat(m.node, m.endpoint, m.resources, self.clock(), processes, m.process):
            log.info("node_joined", node=m.node, endpoint=m.endpoint)
        self.nodes.set_log_endpoint(m.node, m.log_endpoint)
        self.nodes.set_tags(m.node, m.tags)
        self.nodes.set_code(m.node, m.code)
        if self.nodes.owes_undrain(m.node):
            self._owed_undrain(m.node, m.drained)
        drained = self.nodes.says_drained(m.node, m.drained, m.undrain_token)
        # Beats that come before the drain lands (_drains_told) take that drain.
        told = drained and (m.node in self._drains_told or m.node in self.book.draining_nodes())
        if drained and not told and self.runtime is not None:
            self._drains_told.add(m.node)
            log.info("node_says_drained", node=m.node)
            self.runtime.start_soon(self._drain_told, m.node)
        # The node waits for a beat's reply a share of this (a slow link's come late).
        return {"ok": True, "master": self.config.name, "node_timeout_s": self.config.node_timeout_s}

    def _owed_undrain(self, node: str, drained: bool) -> None:
        """A beat of a node whose drain ended while it could not be told: a drained one is
        told now; one that is not (started again) needs nothing."""
        if not drained:
            self.nodes.undrain_settled(node)
        elif node not in self._undrains_telling and self.runtime is not None:
            endpoint = self.nodes.endpoint(node)
            assert endpoint is not None  # it beat just now
            self._undrains_telling.add(node)
            self.runtime.start_soon(self._tell_owed_undrain, self.runtime, node, endpoint)

    async def _tell_owed_undrain(self, runtime: Runtime, node: str, endpoint: str) -> None:
        try:
            restarted = await tell_undrained(runtime, self.nodes, node, endpoint)
            log.info("owed_undrain_told", node=node, restarted=restarted)
        except TroupeError as exc:  # owed still: its next beat tries again
            log.warning("owed_undrain_failed", node=node, error=str(exc))
        finally:
            self._undrains_telling.discard(node)

    async def _drain_told(self, node: str) -> None:
        try:
            await self.dispatcher.handle(DrainNode(node))
        finally:
            self._drains_told.discard(node)

    def _resolve(self, payload: Any) -> Answer:
        """The cluster's directory: a node asks where an actor of another node listens."""
        full, endpoint = self.nodes.resolve(ResolveControl.decode(payload).address)
        return Answer.now({"address": str(full), "endpoint": endpoint})
