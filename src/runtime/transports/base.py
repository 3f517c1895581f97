"""The transport interface, and the in-memory transport for fast deterministic tests.

A transport moves lists of frames between process mailboxes. Every process has one address
(its mailbox). ``send`` delivers to another process's mailbox; a message that arrived there
comes with a *route* through which ``reply`` answers the sender on the same connection, so a
foreign client that never bound a mailbox still gets its replies and errors.

The ZeroMQ implementation lives in ``zmq`` (ZmqTransport); the two behave alike: bounded queues
with backpressure, ``block=False`` raising MailboxFull instead of waiting. Replies are the
exception: they never wait, so that a peer that does not read cannot stall the process.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from troupe.runtime.core.mailbox import Mailbox
from troupe.runtime.errors import MailboxFull, Unreachable

__all__ = ["MemoryHub", "MemoryTransport", "OnMessage", "Transport", "TransportStats"]

OnMessage = Callable[[Any, list[Any]], Awaitable[None]]
"""Called for every received message with ``(route, frames)``; route is None for replies."""


@dataclass(frozen=True, slots=True)
class TransportStats:
    """Counters of one transport."""

    address: str
    sent: int
    received: int
    peers: int
    replies_dropped: int = 0
    # Batch frames (several messages to one peer in one ZeroMQ message; wire/batch_frames.py).
    batches_sent: int = 0
    batches_received: int = 0
    # Messages sent but held in a batch for a peer that could not take it yet.
    batched_waiting: int = 0


class Transport(Protocol):
    """What the runtime needs from a transport."""

    address: str

    async def serve(self, on_message: OnMessage, *, task_status: Any = ...) -> None:
        """Receive until cancelled, calling ``on_message`` for each message in order."""
        ...

    async def send(self, address: str, frames: list[Any], *, block: bool = True) -> None:
        """Send ``frames`` to the mailbox at ``address``; wait for space unless block=False."""
        ...

    def try_send(self, address: str, frames: list[Any]) -> bool:
        """Send like ``send`` if that needs no waiting; return False, having sent nothing, when
        the peer's queue is full."""
        ...

    async def reply(self, route: Any, frames: list[Any]) -> None:
        """Answer the sender of a received message through its route; never waits."""
        ...

    def try_reply(self, route: Any, frames: list[Any]) -> bool:
        """Answer without ever waiting: a reply the sender's connection cannot take now may be
        held for a bounded retry off the caller; one it will not take (the sender does not read,
        or is gone) is dropped and counted. Return False when it was dropped at once."""
        ...

    def replies_dropped(self) -> dict[str, int]:
        """Replies dropped so far (see ``try_reply``), per mailbox address."""
        ...

    def open_mailbox(self) -> str:
        """Open one more mailbox (one per actor) and return its address."""
        ...

    def forget(self, address: str) -> None:
        """Drop the connection to ``address`` (the peer restarted elsewhere)."""
        ...

    def close(self) -> None:
        """Close every socket; pending outgoing messages are discarded."""
        ...

    def statistics(self) -> TransportStats:
        """Return counters."""
        ...


class MemoryHub:
    """The shared 'network' of in-memory transports: one per test."""

    def __init__(self) -> None:
        self.transports: dict[str, MemoryTransport] = {}
        self.mailboxes: dict[str, tuple[MemoryTransport, Mailbox[tuple[Any, list[Any]]]]] = {}
        self._ids = itertools.count(1)

    def transport(self, capacity: int = 1000, name: str | None = None) -> MemoryTransport:
        """Create a transport with a fresh ``mem://`` address."""
        address = f"mem://{name or next(self._ids)}"
        t = MemoryTransport(self, address, capacity)
        self.transports[address] = t
        return t

    def next_address(self) -> str:
        """A fresh ``mem://`` address."""
        return f"mem://{next(self._ids)}"


class MemoryTransport:
    """An in-process transport: frames go through the same codec, queues are Mailboxes.

    Args:
        hub: the hub that maps addresses to transports.
        address: this transport's ``mem://`` address.
        capacity: the bound of the incoming queue (the stand-in for ZeroMQ's high-water mark).
    """

    def __init__(self, hub: MemoryHub, address: str, capacity: int) -> None:
        self.hub = hub
        self.address = address
        self.capacity = capacity
        self._inboxes: list[Mailbox[tuple[Any, list[Any]]]] = []
        self._replies: Mailbox[list[Any]] = Mailbox(1 << 30, address + "#replies")
        self._tg: anyio.abc.TaskGroup | None = None
        self._on_message: OnMessage | None = None
        # As in the ZeroMQ transport: tried first for every message, so tests cover the same
        # path (a reply settled, a message handled or queued at once, without waiting).
        self.sync_handler: Callable[[Any, list[Any]], bool] | None = None
        self._add_inbox(address)
        self._sent = 0
        self._received = 0
        self._closed = False

    def _add_inbox(self, address: str) -> Mailbox[tuple[Any, list[Any]]]:
        inbox: Mailbox[tuple[Any, list[Any]]] = Mailbox(self.capacity, address)
        self._inboxes.append(inbox)
        self.hub.mailboxes[address] = (self, inbox)
        if self._tg is not None and self._on_message is not None:
            self._tg.start_soon(self._pump_inbox, inbox, self._on_message)
        return inbox

    def open_mailbox(self) -> str:
        """Open one more mailbox (one per actor) and return its address."""
        address = self.hub.next_address()
        self._add_inbox(address)
        return address

    async def serve(self, on_message: OnMessage, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Receive from every mailbox and the reply queue until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._on_message = on_message
            for inbox in self._inboxes:
                tg.start_soon(self._pump_inbox, inbox, on_message)
            tg.start_soon(self._pump_replies, on_message)
            task_status.started()

    async def _pump_inbox(self, inbox: Mailbox[tuple[Any, list[Any]]], on_message: OnMessage) -> None:
        while True:
            route, frames = await inbox.get()
            self._received += 1
            handler = self.sync_handler
            if handler is None or not handler(route, frames):
                await on_message(route, frames)

    async def _pump_replies(self, on_message: OnMessage) -> None:
        while True:
            frames = await self._replies.get()
            self._received += 1
            handler = self.sync_handler
            if handler is None or not handler(None, frames):
                await on_message(None, frames)

    async def send(self, address: str, frames: list[Any], *, block: bool = True) -> None:
        """Queue ``frames`` at the peer; raise Unreachable when no such peer exists."""
        inbox = self._inbox(address)
        frames = [bytes(f) for f in frames]  # what a socket would do: the receiver owns a copy
        if block:
            await inbox.put((self, frames))
        else:
            try:
                inbox.put_nowait((self, frames))
            except MailboxFull as exc:
                raise MailboxFull(f"the mailbox of {address} is full; {exc}") from None
        self._sent += 1

    def try_send(self, address: str, frames: list[Any]) -> bool:
        """Queue ``frames`` at the peer if it has room; False when its queue is full."""
        try:
            self._inbox(address).put_nowait((self, [bytes(f) for f in frames]))
        except MailboxFull:
            return False
        self._sent += 1
        return True

    def _inbox(self, address: str) -> Mailbox[tuple[Any, list[Any]]]:
        entry = self.hub.mailboxes.get(address)
        if entry is None or entry[0].closed:
            raise Unreachable(f"no process listens at {address}")
        return entry[1]

    async def reply(self, route: Any, frames: list[Any]) -> None:
        """Answer through the sender's reply queue (never blocks: replies are not bounded)."""
        self._queue_reply(route, frames)

    def try_reply(self, route: Any, frames: list[Any]) -> bool:
        """Answer at once: the reply queue never makes anyone wait."""
        self._queue_reply(route, frames)
        return True

    def replies_dropped(self) -> dict[str, int]:
        """Always empty: the reply queue is unbounded, so no reply is ever dropped here."""
        return {}

    def _queue_reply(self, route: Any, frames: list[Any]) -> None:
        if isinstance(route, MemoryTransport) and route.take_reply(frames):
            self._sent += 1

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran: nothing reaches this transport any more."""
        return self._closed

    def take_reply(self, frames: list[Any]) -> bool:
        """Queue a reply another memory transport sends back to this one; False once closed."""
        if self._closed:
            return False
        self._replies.put_nowait([bytes(f) for f in frames])
        return True

    async def send_raw(self, address: str, frames: list[Any]) -> None:
        """Send arbitrary frames (tests use this to inject bad input)."""
        await self.hub.mailboxes[address][1].put((self, list(frames)))

    def forget(self, address: str) -> None:
        """Nothing to drop: memory transports hold no connections."""

    def close(self) -> None:
        """Stop accepting messages."""
        self._closed = True
        for inbox in self._inboxes:
            inbox.close()
            self.hub.mailboxes.pop(inbox.name, None)
        self._replies.close()
        self.hub.transports.pop(self.address, None)

    def statistics(self) -> TransportStats:
        """Return counters."""
        return TransportStats(self.address, self._sent, self._received, 0)
