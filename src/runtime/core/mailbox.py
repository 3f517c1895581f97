"""A bounded FIFO with backpressure: the mailbox of an actor, and the in-memory wire.

Putting into a full mailbox either waits for space (backpressure) or raises MailboxFull when
the caller asked not to wait. Nothing is ever dropped silently. Built on asyncio futures rather
than anyio streams because it sits on the per-message hot path; it is only used from the
event loop thread that owns it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from troupe.runtime.errors import ActorStopped, MailboxFull

__all__ = ["Mailbox", "MailboxStats"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class MailboxStats:
    """A snapshot of a mailbox: what ``ctl status`` and tests read."""

    capacity: int
    depth: int
    high_water: int
    put: int
    got: int
    waited_puts: int
    refused_puts: int
    closed: bool


class Mailbox(Generic[T]):
    """A bounded FIFO queue for one consumer task.

    Args:
        capacity: the most items held at once; a put beyond it waits or raises.
        name: used in error messages.
    """

    def __init__(self, capacity: int, name: str = "") -> None:
        if capacity < 1:
            raise ValueError(f"mailbox capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.name = name
        self._items: deque[T] = deque()
        self._getter: asyncio.Future[None] | None = None
        self._putters: deque[asyncio.Future[None]] = deque()
        self._reserved = 0  # slots handed to woken putters that have not appended yet
        self._closed = False
        self._high = 0
        self._put = 0
        self._got = 0
        self._waited = 0
        self._refused = 0

    def __len__(self) -> int:
        return len(self._items)

    def statistics(self) -> MailboxStats:
        """Return a frozen snapshot of the counters."""
        return MailboxStats(
            self.capacity,
            len(self._items),
            self._high,
            self._put,
            self._got,
            self._waited,
            self._refused,
            self._closed,
        )

    def full(self) -> bool:
        """True when a put would have to wait (or is refused): no room, or closed."""
        return self._closed or len(self._items) + self._reserved >= self.capacity or bool(self._putters)

    def consumer_parked(self) -> bool:
        """True when the consumer waits in ``get`` on an empty mailbox, with nothing handed to it
        yet and no putter woken with a slot: an item handled elsewhere now cannot overtake one
        it holds or one on its way in. (Then ``full`` is False too: room, open, no putters.)"""
        getter = self._getter
        return (
            getter is not None
            and not getter.done()
            and not self._items
            and not self._reserved
            and not self._putters
        )

    def put_nowait(self, item: T) -> None:
        """Append ``item`` or raise MailboxFull (ActorStopped once closed)."""
        if self._closed:
            raise ActorStopped(f"mailbox {self.name!r} is closed: the actor has stopped")
        if len(self._items) + self._reserved >= self.capacity:
            self._refused += 1
            raise MailboxFull(
                f"mailbox {self.name!r} is full ({self.capacity} messages); send with "
                "block=True to wait for space, or raise the actor's mailbox capacity"
            )
        self._append(item)

    async def put(self, item: T) -> None:
        """Append ``item``, waiting while the mailbox is full (backpressure)."""
        if self._closed:
            raise ActorStopped(f"mailbox {self.name!r} is closed: the actor has stopped")
        if len(self._items) + self._reserved < self.capacity and not self._putters:
            self._append(item)
            return
        self._waited += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._putters.append(fut)
        try:
            await fut
        except BaseException:
            if fut in self._putters:
                self._putters.remove(fut)
            elif fut.done() and not fut.cancelled() and not self._closed:
                self._reserved -= 1
                self._wake_putter()  # pass the slot we were given to the next waiter
            raise
        if self._closed:
            raise ActorStopped(f"mailbox {self.name!r} closed while waiting for space")
        self._reserved -= 1
        self._append(item)

    def _append(self, item: T) -> None:
        self._items.append(item)
        self._put += 1
        if len(self._items) > self._high:
            self._high = len(self._items)
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)

    def get_nowait(self) -> T | None:
        """Pop the oldest item, or return None when empty."""
        if not self._items:
            return None
        item = self._items.popleft()
        self._got += 1
        self._wake_putter()
        return item

    async def get(self) -> T:
        """Pop the oldest item, waiting for one.

        Raises:
            ActorStopped: the mailbox is closed and empty.
        """
        while not self._items:
            if self._closed:
                raise ActorStopped(f"mailbox {self.name!r} is closed")
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getter = fut
            try:
                await fut
            finally:
                if self._getter is fut:
                    self._getter = None
        item = self._items.popleft()
        self._got += 1
        self._wake_putter()
        return item

    def _wake_putter(self) -> None:
        while self._putters and len(self._items) + self._reserved < self.capacity:
            fut = self._putters.popleft()
            if not fut.done():
                self._reserved += 1
                fut.set_result(None)
                return

    def close(self) -> None:
        """Refuse new items; waiting putters get ActorStopped; queued items stay to be drained."""
        self._closed = True
        while self._putters:
            fut = self._putters.popleft()
            if not fut.done():
                fut.set_result(None)
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)

    def drain(self) -> list[T]:
        """Remove and return every queued item."""
        items = list(self._items)
        self._items.clear()
        self._got += len(items)
        return items
