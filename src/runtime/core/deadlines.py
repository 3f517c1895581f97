"""Ask deadlines: one loop timer for every ask in flight, instead of one timer per ask.

A timer per ask (``loop.call_later`` then ``cancel``) costs about 2 µs under uvloop, a large
share of a small ask. Here an ask pushes ``(deadline, id, future, ...)`` on a heap, and a single
timer is armed for the earliest deadline. An answered ask is not removed: its entry is skipped
when it comes up, and the heap is rebuilt from the live entries when stale ones dominate, so
the heap stays proportional to the asks in flight.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Collection
from typing import Any

from troupe.runtime.errors import AskTimeout

__all__ = ["AskDeadlines"]

# The heap is rebuilt when it reaches twice its live size after the last rebuild plus this
# many entries: amortized, a rebuild costs at most two entry checks per ask. Small, so that an
# answered ask's entry (and its future, and the reply that holds) dies young: entries that
# outlive a collection of the youngest GC generation are promoted, and enough of them set off
# full collections, which in a worker (numpy, torch imported) cost far more than the rebuilds.
# With 1024, 64 asks outstanding spent about twice the GC time per ask.
_SLACK = 64


class AskDeadlines:
    """Fails the future of every ask whose deadline passes with AskTimeout.

    Args:
        loop: the event loop whose clock (``loop.time()``) the deadlines are on.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[tuple[float, int, asyncio.Future[Any], object, str, float]] = []
        self._ids = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = float("inf")
        self._compact_at = _SLACK  # heap size that triggers the next rebuild

    def __len__(self) -> int:
        return len(self._heap)

    def watch(self, fut: asyncio.Future[Any], timeout: float, target: object, msg_type: str) -> None:
        """Fail ``fut`` with AskTimeout ``timeout`` seconds from now unless it is done by then."""
        at = self.loop.time() + timeout
        heap = self._heap
        heapq.heappush(heap, (at, next(self._ids), fut, target, msg_type, timeout))
        if len(heap) >= self._compact_at:
            self._compact()
        if at < self._armed_at:
            self._arm(at)

    def future(self, timeout: float, target: object, msg_type: str) -> asyncio.Future[Any]:
        """A new future of the loop, watched (``watch``)."""
        loop = self.loop
        fut: asyncio.Future[Any] = loop.create_future()
        # ``watch``, inlined: this runs for every ask.
        at = loop.time() + timeout
        heap = self._heap
        heapq.heappush(heap, (at, next(self._ids), fut, target, msg_type, timeout))
        if len(heap) >= self._compact_at:
            self._compact()
        if at < self._armed_at:
            self._arm(at)
        return fut

    def fail(
        self, futs: Collection[asyncio.Future[Any]], error: Callable[[object, str], BaseException]
    ) -> None:
        """Fail those of ``futs`` still pending now, before their deadlines, each with
        ``error(target, msg_type)`` of its ask."""
        for _, _, fut, target, msg_type, _ in self._heap:
            if fut in futs and not fut.done():
                fut.set_exception(error(target, msg_type))

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if not e[2].done()]
        heapq.heapify(self._heap)
        self._compact_at = 2 * len(self._heap) + _SLACK

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = at
        self._timer = self.loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._armed_at = float("inf")
        heap = self._heap
        now = self.loop.time()
        while heap and heap[0][0] <= now:
            _, _, fut, target, msg_type, timeout = heapq.heappop(heap)
            if not fut.done():
                fut.set_exception(
                    AskTimeout(
                        f"no reply to {msg_type!r} from {target} within {timeout}s; "
                        "the target may be busy, hung or gone (see `troupe ctl status`)"
                    )
                )
        while heap and heap[0][2].done():
            heapq.heappop(heap)  # answered long ago: no reason to wake up for it
        if heap:
            self._arm(heap[0][0])

    def close(self) -> None:
        """Stop the timer; futures still watched are left as they are."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_at = float("inf")
        self._heap.clear()
