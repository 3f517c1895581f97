"""What the master knows about nodes: where they listen, their resources, whether alive.

:class:`NodeTable` is the master's node directory: the endpoint and resources each node last
reported, the processes it runs with their mailboxes, and whether it is alive. A node is alive
from its first beat until it stays silent for ``timeout_s``; :meth:`NodeTable.expired` (called
on the master's clock tick, with ``now`` passed in) names the nodes that just died, once each.
A node that says it stops (``node_left``, :meth:`NodeTable.leave`) is not alive from then on,
and ``left``: listed as stopped, not dead. A dead or left node that beats again is alive again;
its workers register anew when the master answers them ``unknown_worker``. A node dead (or
left) for ``FORGET_DEAD_S`` is forgotten: ``ctl status`` lists it for an hour, and a long-lived
master whose hosts come and go (each a node of its own name) does not list every host it ever
saw. A forgotten node that beats again is new again.

It is also the cluster's directory of names: every beat carries the node's processes (``name
-> {endpoint, actors: {actor: endpoint}}``), and :meth:`NodeTable.resolve` answers a node's
``resolve`` of an actor on another host, so actors on host A ask actors on host B by name. A
dead node's actors are not resolved (its workers may be gone or unreachable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from troupe.runtime.core.control_payloads import clipped
from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.errors import UnknownActor

__all__ = ["FORGET_DEAD_S", "NodeInfo", "NodeTable", "ProcessEntry"]

FORGET_DEAD_S = 3600.0
"""A node silent this long after it was declared dead is forgotten (its last beat counts)."""


@dataclass(frozen=True, slots=True)
class ProcessEntry:
    """One process of a node as its beat reported it: its control mailbox and its actors'."""

    endpoint: str
    actors: dict[str, str]


@dataclass(slots=True)
class NodeInfo:
    """One node as the master last heard of it."""

    node: str
    endpoint: str
    first_seen: float
    last_beat: float
    alive: bool = True
    resources: dict[str, Any] = field(default_factory=dict)
    processes: dict[str, ProcessEntry] = field(default_factory=dict)
    revivals: int = 0  # times it came back after being declared dead (a link that was cut)
    log_endpoint: str = ""  # the node's log stream (``troupe logs tail --master``); "" if none
    tags: tuple[str, ...] = ()  # what it offers replicas (``[node] tags``; placement.py)
    code: str = ""  # the troupe code it runs (runtime/code_identity.py); "" from older nodes
    left: bool = False  # not alive because it said it stops (node_left), not because it went silent
    undrain_token: str = ""  # the token of the last master_undrained sent it ("" if none)
    undrain_owed: bool = False  # its drain ended while it could not be told (NodeTable.owe_undrain)
    process: str = ""  # the node process's identity (process_identity); "" from older nodes


class NodeTable:
    """Nodes that beat to the master, and which of them went silent.

    Args:
        timeout_s: a node silent this long is dead.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._nodes: dict[str, NodeInfo] = {}

    def beat(
        self,
        node: str,
        endpoint: str,
        resources: dict[str, Any],
        now: float,
        processes: dict[str, ProcessEntry] | None = None,
        process: str = "",
    ) -> bool:
        """Record a beat; return True when the node is new or was dead.

        ``processes`` None (a beat that does not list them) keeps what the node said last;
        ``process`` "" (an older node) keeps the process identity it had.
        """
        info = self._nodes.get(node)
        if info is None:
            info = NodeInfo(node, endpoint, now, now, True, resources, processes or {}, process=process)
            self._nodes[node] = info
            return True
        info.process = process or info.process
        back = not info.alive
        info.endpoint, info.last_beat, info.alive = endpoint or info.endpoint, now, True
        info.revivals += back and not info.left  # a restart after a stop is no cut link
        info.left = False
        if resources:
            info.resources = resources
        if processes is not None:
            info.processes = processes
        return back

    def contended(self, node: str, endpoint: str, process: str) -> NodeInfo | None:
        """The live node of the name, when a beat from ``endpoint`` and ``process`` is another
        node's: another process, at another endpoint, beating under the name of one that is
        alive and has not left. None otherwise (an older node, which says no process, included):
        the beat is the node's own, or that of a node started again once the other stopped."""
        info = self._nodes.get(node)
        if info is None or not info.alive or info.left or not info.process or not process:
            return None
        return info if info.process != process and info.endpoint != endpoint else None

    def resolve(self, address: ActorAddress) -> tuple[ActorAddress, str]:
        """The full address and mailbox endpoint of an actor on a live node.

        ``node/process/actor`` looks at that node only; ``process/actor`` and ``actor`` at
        every live node, by name, the first match winning. ``NODE/node`` is that node's own
        control mailbox.

        Raises:
            UnknownActor: no live node reports such an actor.
        """
        named = self._nodes.get(address.process)
        if not address.node and address.actor == "node" and named is not None and named.alive:
            return ActorAddress("", named.node, "node"), named.endpoint
        if address.node:
            info = self._nodes.get(address.node)
            candidates = [info] if info is not None and info.alive else []
        else:
            candidates = [n for n in self.nodes() if n.alive]
        for info in candidates:
            for process, entry in sorted(info.processes.items()):
                if address.process not in ("", process):
                    continue
                endpoint = entry.actors.get(address.actor)
                if endpoint is not None:
                    return ActorAddress(info.node, process, address.actor), endpoint
        where = f"node {clipped(address.node)}" if address.node else "any live node"
        raise UnknownActor(
            f"no running actor {address.shown()} on {where} of the cluster; see `troupe ctl status`"
        )

    def set_tags(self, node: str, tags: tuple[str, ...]) -> None:
        """Record the tags ``node`` offers (its beat says; a restart may change them)."""
        info = self._nodes.get(node)
        if info is not None:
            info.tags = tags

    def set_code(self, node: str, code: str) -> None:
        """Record the code ``node`` runs (its beat says; an upgrade changes it)."""
        info = self._nodes.get(node)
        if info is not None:
            info.code = code

    def set_log_endpoint(self, node: str, log_endpoint: str) -> None:
        """Record where ``node`` publishes its log stream (its beat says; a restart changes it)."""
        info = self._nodes.get(node)
        if info is not None:
            info.log_endpoint = log_endpoint

    def expired(self, now: float) -> list[str]:
        """Mark dead, and return, the alive nodes silent for longer than ``timeout_s``; forget
        the dead ones silent for longer than ``FORGET_DEAD_S`` more."""
        dead = [n.node for n in self._nodes.values() if n.alive and now - n.last_beat > self.timeout_s]
        for node in dead:
            self._nodes[node].alive = False
        gone = self.timeout_s + FORGET_DEAD_S
        for node in [n.node for n in self._nodes.values() if not n.alive and now - n.last_beat > gone]:
            del self._nodes[node]
        return dead

    def forgive(self, held_s: float, now: float) -> None:
        """The master was not listening for ``held_s`` seconds (its loop was held): that
        silence is not the nodes'. Each live node's last beat moves on by it (never past
        ``now``), so a node is judged on the time the master could hear it."""
        for info in self._nodes.values():
            if info.alive:
                info.last_beat = min(now, info.last_beat + held_s)

    def undrain_sent(self, node: str, token: str) -> None:
        """Record the token of the ``master_undrained`` sent to ``node`` (it owes it none now)."""
        info = self._nodes.get(node)
        if info is not None:
            info.undrain_token, info.undrain_owed = token, False

    def owe_undrain(self, node: str) -> None:
        """The master ended ``node``'s drain and could not tell it: it is stopped or dead, or
        did not answer. Its next beat that says it is drained gets the undrain then
        (``NodeControls``), rather than draining it again; a beat that says it is not drained
        (a node started again: its drain was the master's only) settles it."""
        info = self._nodes.get(node)
        if info is not None:
            info.undrain_owed = True

    def owes_undrain(self, node: str) -> bool:
        """Whether ``node``'s drain ended while it could not be told (:meth:`owe_undrain`)."""
        info = self._nodes.get(node)
        return info is not None and info.undrain_owed

    def says_drained(self, node: str, drained: bool, token: str) -> bool:
        """Whether a beat of ``node`` that says ``drained`` stands: the beat's ``token`` (its
        last undrain taken) is the one this master sent it last, or it sent none (a master
        that restarted learns a node's drain so), and no undrain is owed it. A beat sent
        before the node took the last undrain is stale: its drain was ended. Only a drain is
        learned so, never its end: a drain asked of the master reaches the node only once its
        tasks are done."""
        info = self._nodes.get(node)
        return drained and info is not None and not info.undrain_owed and info.undrain_token in ("", token)

    def undrain_settled(self, node: str) -> None:
        """``node`` beat that it is not drained: the undrain owed it, if any, has nothing to do."""
        info = self._nodes.get(node)
        if info is not None:
            info.undrain_owed = False

    def leave(self, node: str) -> bool:
        """The node said it stops: not alive, and ``left``. Returns whether it was alive (a
        second word of its leave, or one after it was declared dead, changes nothing)."""
        info = self._nodes.get(node)
        if info is None or not info.alive:
            return False
        info.alive, info.left = False, True
        return True

    def mark_dead(self, node: str) -> None:
        """Declare a node dead now (an operator or its supervisor said so)."""
        info = self._nodes.get(node)
        if info is not None:
            info.alive = False

    def endpoint(self, node: str) -> str | None:
        """Return the node's control endpoint, or None if it never beat."""
        info = self._nodes.get(node)
        return info.endpoint if info is not None else None

    def nodes(self) -> list[NodeInfo]:
        """Return every node seen but those dead for ``FORGET_DEAD_S``, by name."""
        return [self._nodes[n] for n in sorted(self._nodes)]
