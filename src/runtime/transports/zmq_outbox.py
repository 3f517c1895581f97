"""Replies that could not leave at once, held per asker and retried off the reader.

A reply goes out on the mailbox (a ROUTER) through the asker's connection. When that
connection's queue is at its high-water mark the send fails (EAGAIN), for one of two reasons:
a burst of replies outran ZeroMQ's I/O thread for a moment (the asker reads, the reply must
still arrive), or the asker does not read at all. Nobody may wait for it either way: the
reader that sent it serves every other peer too (DESIGN.md, invariant 7). So the reply is
held here, in a bounded queue per asker, and retried from loop callbacks with a backoff; what
still cannot leave after ``linger_s``, or does not fit the bounds, is dropped and counted.
An asker that is gone (EHOSTUNREACH) loses its replies at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from .zmq_socket import Watched

__all__ = ["FIRST_RETRY_S", "MAX_RETRY_S", "ReplyOutbox"]

Write = Callable[[Watched, list[Any]], None]
Dropped = Callable[[Watched, bytes, zmq.ZMQError, int], None]

# The first and the longest wait before a send the peer could not take is tried again (held
# replies here; held batches in zmq_sending.py back off alike).
FIRST_RETRY_S = 0.0005
MAX_RETRY_S = 0.05


class _Held:
    __slots__ = ("identity", "mailbox", "replies", "since")

    def __init__(self, mailbox: Watched, identity: bytes, now: float) -> None:
        self.mailbox = mailbox
        self.identity = identity
        self.replies: deque[list[Any]] = deque()
        self.since = now  # when its oldest reply was first refused


class ReplyOutbox:
    """The replies held for askers whose connection was full, and their retries.

    Args:
        write: queues one message on a socket without waiting; raises zmq.Again when full.
        dropped: told of each batch of replies dropped for one asker (mailbox, identity, the
            error, how many).
        per_asker: the most replies held for one asker.
        total: the most replies held for all askers together.
        linger_s: how long an asker's oldest held reply is retried before its replies go.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        write: Write,
        dropped: Dropped,
        per_asker: int,
        total: int,
        linger_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self._dropped = dropped
        self.per_asker = per_asker
        self.total = total
        self.linger_s = linger_s
        self._clock = clock
        self._held: dict[tuple[Watched, bytes], _Held] = {}
        self.pending = 0  # replies held now, for all askers
        self._timer: asyncio.TimerHandle | None = None
        self._delay = FIRST_RETRY_S
        self._loop: asyncio.AbstractEventLoop | None = None

    def holds(self, mailbox: Watched, identity: bytes) -> bool:
        """Whether replies wait for this asker (a new one must queue behind them)."""
        return (mailbox, identity) in self._held

    def hold(
        self, mailbox: Watched, identity: bytes, frames: list[Any], loop: asyncio.AbstractEventLoop
    ) -> bool:
        """Hold one reply (frames without the identity) for a retry; False if it was dropped."""
        key = (mailbox, identity)
        held = self._held.get(key)
        if (held is not None and len(held.replies) >= self.per_asker) or self.pending >= self.total:
            self._dropped(mailbox, identity, zmq.Again(), 1)
            return False
        if held is None:
            held = self._held[key] = _Held(mailbox, identity, self._clock())
        held.replies.append(frames)
        self.pending += 1
        self._loop = loop
        self._schedule()
        return True

    def _schedule(self) -> None:
        if self._timer is None and self._loop is not None and not self._loop.is_closed():
            self._timer = self._loop.call_later(self._delay, self._retry)

    def _retry(self) -> None:
        self._timer = None
        now = self._clock()
        moved = False
        for key, held in list(self._held.items()):
            error: zmq.ZMQError | None = None
            while held.replies:
                try:
                    self._write(held.mailbox, [held.identity, *held.replies[0]])
                except zmq.Again as exc:
                    if now - held.since >= self.linger_s:
                        error = exc  # the asker has not read for the whole linger: give up
                    break
                except zmq.ZMQError as exc:  # gone (EHOSTUNREACH), or the mailbox closed
                    error = exc
                    break
                held.replies.popleft()
                self.pending -= 1
                held.since = now
                moved = True
            if error is not None:
                self.pending -= len(held.replies)
                self._dropped(held.mailbox, held.identity, error, len(held.replies))
                held.replies.clear()
            if not held.replies:
                del self._held[key]
        # Soon again while replies move (a burst the I/O thread is catching up with); slower
        # while they do not (an asker that does not read), up to a few retries a second.
        self._delay = FIRST_RETRY_S if moved else min(self._delay * 2, MAX_RETRY_S)
        if self._held:
            self._schedule()

    def close(self) -> None:
        """Forget every held reply (the sockets are closing) and stop retrying."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held.clear()
        self.pending = 0
