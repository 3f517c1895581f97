"""Answering through a mailbox of the ZeroMQ transport, without ever waiting.

A reply goes out on the mailbox (a ROUTER) through the asker's connection. Whoever sends it also
serves every other peer, so a reply never waits (``try_reply``): one the asker's connection
cannot take now is held and retried (``zmq_outbox``), and dropped, counted per mailbox and
logged at most once per asker per interval where it still cannot leave. The replies made while
a mailbox's reader drains leave together at the drain's end, batched per asker that sends
batches itself (wire/batch_frames.py).

:class:`ZmqReplies` is a part of :class:`~troupe.runtime.transports.zmq.ZmqTransport`: it uses
the transport's fields.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from troupe.runtime.library_logging import get_logger
from troupe.runtime.wire.batch_frames import MAX_BATCH_MESSAGES, batch_frames

from .zmq_socket import Watched

if TYPE_CHECKING:
    from troupe.runtime.core.peer_limits import PeerLogGate

    from .zmq_outbox import ReplyOutbox

__all__ = ["DROP_LOG_INTERVAL_S", "HELD_IN_ALL", "HELD_PER_ASKER", "REPLY_LINGER_S", "ZmqReplies"]

log = get_logger(__name__)

# A peer whose replies are dropped gets one log line per this many seconds, whatever the rate.
DROP_LOG_INTERVAL_S = 10.0
# How long replies an asker's connection cannot take are retried before they are dropped.
REPLY_LINGER_S = 5.0
# Replies held for retries, at least (the high-water mark may be set lower): for one asker, and
# for all together. They bound memory while an asker does not read; bursts must fit.
HELD_PER_ASKER = 1000
HELD_IN_ALL = 10_000


class ZmqReplies:
    """Sends the replies of the transport's mailboxes (a part of the transport)."""

    _mailboxes: list[Watched]
    _outbox: ReplyOutbox
    _drop_log: PeerLogGate
    _loop: asyncio.AbstractEventLoop | None
    _closed: bool
    _sent: int
    _batches_sent: int
    _replies_dropped: int
    _write: Callable[[Watched, list[Any]], None]  # zmq_sending

    async def reply(self, route: Any, frames: list[Any]) -> None:
        """Answer through ``route``; never waits (see ``try_reply``)."""
        self.try_reply(route, frames)

    def try_reply(self, route: Any, frames: list[Any]) -> bool:
        """Answer through ``route`` (mailbox, identity) without ever waiting.

        Whoever sends a reply (the reader callback, a pump, an actor's task) also serves every
        other peer, so a peer that does not read, or is gone, must not stall it (DESIGN.md,
        invariant 7); waiting would not even end: with ROUTER_MANDATORY a send to one full or
        closing connection fails while EVENTS reports POLLOUT for the others. A reply that the
        asker's connection cannot take now is held and retried off the reader (``ReplyOutbox``):
        a burst that outran the I/O thread still arrives. One that still cannot leave after
        ``REPLY_LINGER_S``, or beyond the outbox's bounds, or to an asker that is gone, is
        dropped, counted per mailbox (``replies_dropped``) and logged at most once per asker
        per interval.

        Returns:
            False when the reply was dropped at once; True when it was sent or held.
        """
        if route is None:
            return True
        mailbox, identity = route[0], route[1]  # with CURVE, the sender's user id follows
        replies = mailbox.replies
        if mailbox.draining and len(frames) == 1 and identity in mailbox.batchers:
            # Made while the reader drains: it leaves with the asker's others when the drain ends.
            held = replies.get(identity)
            if held is None:
                replies[identity] = [frames[0]]
            else:
                held.append(frames[0])
                if len(held) >= MAX_BATCH_MESSAGES:  # the asker starts on these meanwhile
                    self._send_replies(mailbox, identity, replies.pop(identity))
            return True
        if replies and identity in replies:  # the ones made before it leave first
            self._send_replies(mailbox, identity, replies.pop(identity))
        return self._reply_frames(mailbox, identity, frames, 1)

    def _flush_replies(self, mailbox: Watched) -> None:
        """Send the replies made while the mailbox's reader drained, batched per asker."""
        replies, mailbox.replies = mailbox.replies, {}
        for identity, headers in replies.items():
            self._send_replies(mailbox, identity, headers)

    def _send_replies(self, mailbox: Watched, identity: bytes, headers: list[bytes]) -> None:
        for frame, count in batch_frames(headers):
            self._reply_frames(mailbox, identity, [frame], count)

    def _reply_frames(self, mailbox: Watched, identity: bytes, frames: list[Any], count: int) -> bool:
        """``try_reply`` of one message, or of one batch frame holding ``count`` replies."""
        outbox = self._outbox
        if outbox.pending and outbox.holds(mailbox, identity):
            return self._hold(mailbox, identity, frames)  # behind the ones already held
        try:
            self._write(mailbox, [identity, *frames])
        except zmq.Again:
            return self._hold(mailbox, identity, frames)
        except zmq.ZMQError as exc:
            self._reply_dropped(mailbox, identity, exc, count)
            return False
        if count > 1:
            self._sent += count - 1
            self._batches_sent += 1
        return True

    def _hold(self, mailbox: Watched, identity: bytes, frames: list[Any]) -> bool:
        if self._loop is None or self._closed:
            self._reply_dropped(mailbox, identity, zmq.Again(), 1)
            return False
        return self._outbox.hold(mailbox, identity, frames, self._loop)

    def _reply_dropped(self, mailbox: Watched, identity: bytes, exc: zmq.ZMQError, n: int) -> None:
        mailbox.replies_dropped += n
        self._replies_dropped += n
        key = (mailbox.peer, identity)
        if not self._drop_log.should_log(key):
            return
        # EAGAIN: the asker's queue stayed at its high-water mark (it does not read): worth a
        # warning. EHOSTUNREACH: the asker disconnected, having given up (an ask timed out).
        # Else: the mailbox closed under it at shutdown.
        not_reading = isinstance(exc, zmq.Again)
        (log.warning if not_reading else log.info)(
            "reply_dropped",
            mailbox=mailbox.peer,
            peer=identity.hex(),
            reason="asker_not_reading" if not_reading else exc.strerror,
            dropped=n,
            unlogged_drops=self._drop_log.take_quiet(key),
            total=mailbox.replies_dropped,
        )

    def replies_dropped(self) -> dict[str, int]:
        """Replies dropped so far, per mailbox endpoint (see ``try_reply``)."""
        return {w.peer: w.replies_dropped for w in self._mailboxes}
