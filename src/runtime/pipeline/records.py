"""The engine's records: an item on its way, a replica, an output held for the next stage, and a
stage's queue and replicas."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio

from troupe.runtime.core.ref import ActorRef
from troupe.runtime.placement import Host

from .config import StageConfig
from .model import StageMeter

__all__ = ["Handle", "Item", "Replica", "StageState", "node_of"]


@dataclass(slots=True)
class Item:
    """One task on its way through the stages."""

    task_id: str
    seed: int
    data: Any
    attempt: int = 0
    undelivered: int = 0  # calls of it in this stage its replica's actor was missing for


_NO_CALL = object()  # ``working_on`` when none of a replica's calls is being worked on


@dataclass(eq=False)
class Replica:
    """A worker process with one stage actor (and, feeding a next stage, its outbox)."""

    name: str
    ref: ActorRef | None = None
    busy: int = 0  # items in its outstanding calls
    calls: int = 0  # outstanding calls (at most the stage's inflight)
    last_reply: float = 0.0  # when its last call answered: the next one's service starts then
    retiring: bool = False
    host: Host | None = None
    held: int = 0  # outputs it holds for the next stage, not yet released
    lost: bool = False  # its node died, or it failed: what it held is gone
    scopes: list[anyio.CancelScope] = field(default_factory=list)  # its outstanding calls, as sent
    incarnation: int | None = None  # its worker's, as its node told at the start
    gone_why: str = ""  # why the engine gave up its calls
    # The call it was working on when it was lost: its actor takes calls one at a time, in
    # order, so the others only waited in its mailbox (None: it had none).
    working_on: anyio.CancelScope | object | None = None
    node: str = ""  # its node's own name, as the node answered its start ("": not told)
    outbox_at: str = ""  # its outbox's mailbox endpoint, as the node answered its start
    # What it receives whole (message bound in bytes, max_frames), as it said at its start: a
    # call must fit it (``call_fit``). None: it said none (an older replica).
    receives: tuple[int, int] | None = None

    def give_up(self, why: str, working: bool = True) -> None:
        """End the calls outstanding here: they fail with ``why`` (and their items are retried).
        ``working`` False: none of them is being worked on (the one that was has ended, and
        made the replica fail), so every one only waited behind it (its items go back to their
        queue, no attempt counted)."""
        self.gone_why = why
        self.working_on = (self.scopes[0] if self.scopes else None) if working else _NO_CALL
        for scope in list(self.scopes):
            scope.cancel()

    @property
    def outbox(self) -> str:
        """The actor that hands over what this replica holds."""
        return f"{self.node}/{self.name}/outbox" if self.node else f"{self.name}/outbox"


@dataclass(eq=False)
class Handle:
    """An output held by the replica that made it, until every stage it feeds has settled it."""

    holder: Replica
    key: str
    size: int
    refs: int = 0


@dataclass
class StageState:
    """One stage of the run: its input queue, its replicas, its meter and hooks."""

    index: int
    cfg: StageConfig
    queue: deque[Item] = field(default_factory=deque)
    replicas: list[Replica] = field(default_factory=list)
    starting: int = 0
    start_failures: int = 0  # replica starts in a row that failed in a way that may pass
    meter: StageMeter | None = None
    hooks: tuple[str, ...] = ()

    def ready(self) -> list[Replica]:
        """The replicas that may be given work."""
        return [r for r in self.replicas if r.ref is not None and not r.retiring]


def node_of(replica: Replica) -> str:
    """The node ``replica`` runs on, for logs and status."""
    return replica.host.name if replica.host is not None else "?"
