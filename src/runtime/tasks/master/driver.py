"""The master's driver: events into the task book, records into the journal, commands out.

The :class:`~troupe.runtime.tasks.book.TaskBook` decides; this module performs its contract with
group commit. Callers (the master's control handlers, its clock) queue events; one loop takes
every queued event, calls ``book.handle(event, now, wall)`` for each in arrival order, writes all
their Record commands in ONE transaction (``journal.stage`` on the loop, then
``journal.commit`` in a thread: one fsync), and only then hands out the other commands. So
every record of a ``handle`` call is durable before any command of that call is performed (the
book's rule), and one fsync covers every event that arrived while the previous one ran: a busy
master pays one fsync per batch, not per task.

Commands go two ways. Those that answer the event (Lease, Ack, Reject) return to its caller.
The rest (CancelLease, NodeDrained, JobFinished) may come from any event, the clock's SchedulerTick
included, and go to the ``side`` callback that the master performs them with.

A report and the request it carries (see :meth:`Dispatcher.put_report`) are one entry of
the queue, handled back to back.

Prefetch: a worker may hold leases ahead of its slots (see :mod:`troupe.runtime.tasks.book`),
and one request or report is answered with several leases, all journaled in the batch's one
transaction. While any request is parked (a worker waits idle for a task), no lease ahead is
granted: an idle worker comes before a busy worker's queue, and at a job's tail the last tasks
go to idle workers instead of waiting behind running ones. Parked requests, when tried
again, get no lease ahead either.

Long polls: a worker that asks for tasks when none is pending may wait up to its deadline. Its
request is parked, and after every batch that made a task pending (a submit, a requeue, a
backoff ending) and after every SchedulerTick (a straggler may now deserve a backup copy) parked
requests are tried again in arrival order. A pass tries at most one fruitless request per
worker signature (node and resources): a worker just like one that got nothing would get
nothing too, and trying every parked worker would cost O(workers x running tasks) a pass.

A big submit (a job of ``BULK_TASKS`` tasks or more) ends its batch: the journal writes its
rows in the commit's thread (``Journal.stage``), and a lease of one of its tasks in the same
batch would follow them there. Parked requests are tried again in the next batch, which runs at
once without another event to wake the driver.

Work that must not meet a batch (a running master's compaction: ``compaction.py``, which
writes the journal and drops tasks from the book) runs through :meth:`Dispatcher.exclusive`:
between two batches, after the one in hand is committed, before the next begins. The journal is
not safe for concurrent use, and its rows and the book must agree whenever a batch reads them.

Time: ``now`` is the monotonic clock's (leases, backoffs, long polls: durations, which a step of
the wall clock must not stretch or cut), ``wall`` the wall clock's (what the book journals or
shows as a time); see :mod:`troupe.runtime.tasks.book`.

If the journal fails, the book has moved on in memory and only a restart from the
journal is consistent again: the driver stops, every waiting caller gets the JournalError and
:meth:`Dispatcher.run` raises it, which stops the master.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from troupe.runtime.errors import JournalError, TaskError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.start_limits import in_thread
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.journal import Journal
from troupe.runtime.tasks.journal_bulk import is_bulk
from troupe.runtime.tasks.state import (
    Ack,
    Command,
    Event,
    JobSubmitted,
    Lease,
    Record,
    Reject,
    RequestTask,
    SchedulerTick,
    SubmitJob,
    TaskRecord,
    TaskState,
)

__all__ = ["Dispatcher", "DispatcherStats", "SideCommands"]

log = get_logger(__name__)

SideCommands = Callable[[list[Command]], None]
"""Performs the commands that answer nobody in particular (CancelLease, NodeDrained, ...)."""

_REPLY = (Lease, Ack, Reject)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class DispatcherStats:
    """Counters of the driver.

    Attributes:
        events: events handled.
        batches: journal transactions written (one per batch that had records).
        records: records written.
        largest_batch: most events handled in one batch.
        append_s: seconds spent journaling batches (stage and commit).
        parked: long-poll requests waiting now.
        retries: parked requests tried again.
    """

    events: int
    batches: int
    records: int
    largest_batch: int
    append_s: float
    parked: int
    retries: int


class _Parked:
    """A worker's request waiting for a task."""

    __slots__ = ("deadline", "free_slots", "future", "signature")

    def __init__(
        self,
        future: asyncio.Future[list[Command]],
        free_slots: int,
        deadline: float,
        signature: Hashable,
    ) -> None:
        self.future = future
        self.free_slots = free_slots
        self.deadline = deadline
        self.signature = signature


class _Then:
    """The request that follows a report in the same entry (see :meth:`Dispatcher.put_report`)."""

    __slots__ = ("request",)

    def __init__(self, request: RequestTask) -> None:
        self.request = request


class Dispatcher:
    """Serializes events into a task book and journals them in group commits.

    Args:
        book: the task book (fresh, or replayed from ``journal``).
        journal: the open journal.
        side: performs side commands, after their records are durable.
        clock: monotonic seconds (``now`` of every event: lease life, backoffs, long polls).
        wall_clock: wall seconds (``wall`` of every event: what is journaled as a time).
        max_batch: most events per batch (bounds one transaction and the latency behind it).
        linger_s: after the first event of a batch arrives, wait this long for more (0: none).
    """

    def __init__(
        self,
        book: TaskBook,
        journal: Journal,
        side: SideCommands,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_batch: int = 4096,
        linger_s: float = 0.0,
    ) -> None:
        self.book = book
        self.journal = journal
        self._side = side
        self._clock = clock
        self._wall_clock = wall_clock
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._queue: deque[tuple[Event, asyncio.Future[list[Command]], Any]] = deque()
        self._exclusive: deque[tuple[Callable[[], Awaitable[Any]], asyncio.Future[Any]]] = deque()
        self._wake = asyncio.Event()
        self._parked: dict[str, _Parked] = {}  # worker id -> its request, in arrival order
        self._retry = False
        self._fatal: JournalError | None = None
        self._events = self._batches = self._records = self._largest = self._retries = 0
        self._append_s = 0.0

    # ------------------------------------------------------------------ callers

    async def handle(self, event: Event) -> list[Command]:
        """Apply one event; return its Lease, Ack and Reject commands once journaled.

        Raises:
            JournalError: the journal failed; the master is stopping.
        """
        return await self.put(event)

    def put(self, event: Event) -> asyncio.Future[list[Command]]:
        """Queue one event now; the future gets what :meth:`handle` returns.

        Events queued back to back (no ``await`` between) are handled in the same batch.

        Raises:
            JournalError: the journal failed; the master is stopping.
        """
        return self._enqueue(event, None)

    async def request(
        self, worker_id: str, free_slots: int, wait_s: float, signature: Hashable
    ) -> list[Command]:
        """Ask for up to ``free_slots`` leases, waiting up to ``wait_s`` while none is pending.

        Args:
            worker_id: the asking worker (registered).
            free_slots: slots it has free.
            wait_s: how long the request may be parked; 0 answers at once.
            signature: workers with equal signatures are served alike (node, resources).

        Returns:
            The Lease commands (empty when the wait ran out), or a Reject.

        Raises:
            JournalError: the journal failed; the master is stopping.
        """
        return await self.put_request(worker_id, free_slots, wait_s, signature)

    def put_request(
        self, worker_id: str, free_slots: int, wait_s: float, signature: Hashable
    ) -> asyncio.Future[list[Command]]:
        """Queue a request now, like :meth:`put`; the future gets what :meth:`request` returns."""
        old = self._parked.pop(worker_id, None)
        if old is not None and not old.future.done():
            old.future.set_result([])  # superseded by this newer request
        return self._enqueue(
            RequestTask(worker_id, free_slots), (self._clock() + max(wait_s, 0.0), signature)
        )

    def put_report(self, event: Event, worker_id: str, free_slots: int) -> asyncio.Future[list[Command]]:
        """Queue a worker's report and its next request (up to ``free_slots`` leases, never
        parked) as one entry: handled back to back in one batch, answered by one future with
        the report's commands followed by the leases granted (a refused request grants none).

        One entry where two would cost a future, a queue slot and a callback more per task.
        """
        old = self._parked.pop(worker_id, None)
        if old is not None and not old.future.done():
            old.future.set_result([])  # superseded by this newer request
        return self._enqueue(event, _Then(RequestTask(worker_id, free_slots)))

    def unpark(self, worker_id: str) -> None:
        """Answer a parked request of the worker with nothing (it left or re-registered)."""
        parked = self._parked.pop(worker_id, None)
        if parked is not None and not parked.future.done():
            parked.future.set_result([])

    async def exclusive(self, work: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``work`` between two batches: after the batch in hand is committed, before the
        next one begins (events that arrive meanwhile wait for it, as for a batch's commit).

        ``work`` may use the journal (in a thread, as a commit does) and change the book; what
        it raises is raised here, and the driver goes on.

        Raises:
            JournalError: the journal failed before ``work`` ran; the master is stopping.
        """
        if self._fatal is not None:
            raise self._fatal
        future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        self._exclusive.append((work, future))
        self._wake.set()
        return await future

    @property
    def failed(self) -> bool:
        """Whether the journal failed and the driver stopped (the master stops too)."""
        return self._fatal is not None

    def statistics(self) -> DispatcherStats:
        """Return a snapshot of the counters."""
        return DispatcherStats(
            self._events,
            self._batches,
            self._records,
            self._largest,
            round(self._append_s, 6),
            len(self._parked),
            self._retries,
        )

    def _enqueue(self, event: Event, park: Any) -> asyncio.Future[list[Command]]:
        if self._fatal is not None:
            raise self._fatal
        future: asyncio.Future[list[Command]] = asyncio.get_running_loop().create_future()
        self._queue.append((event, future, park))
        self._wake.set()
        return future

    # ------------------------------------------------------------------ the loop

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Handle batches until cancelled.

        Raises:
            JournalError: an append failed; nothing of that batch was performed.
        """
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._linger_s > 0 and len(self._queue) < self._max_batch:
                # Let the batch fill: one transaction, one thread hop for more events. Workers
                # holding leases ahead do not wait on this; the rest wait linger_s at most.
                await anyio.sleep(self._linger_s)
            # A retry put off by a big submit comes next; exclusive work between two batches.
            while self._queue or self._retry or self._exclusive:
                if self._exclusive:
                    await self._run_exclusive()
                else:
                    await self._batch()

    async def _run_exclusive(self) -> None:
        work, future = self._exclusive.popleft()
        try:
            result = await work()
        except Exception as exc:  # the caller's to judge: the book and journal are its work's
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(result)

    async def _batch(self) -> None:
        book, clock, wall_clock, queue = self.book, self._clock, self._wall_clock, self._queue
        records: list[Record] = []
        replies: list[tuple[asyncio.Future[list[Command]], list[Command]]] = []
        side: list[Command] = []
        count = 0
        bulk = False
        while queue and count < self._max_batch and not bulk:
            event, future, park = queue.popleft()
            count += 1
            now, wall = clock(), wall_clock()
            if self._parked and isinstance(event, RequestTask) and event.prefetch:
                event = RequestTask(event.worker_id, event.free_slots, prefetch=False)
            # A big job's rows are written in the commit's thread (Journal.stage): end the batch
            # with it, so that no lease of its tasks follows it into that thread's writes.
            bulk = isinstance(event, SubmitJob) and is_bulk(event.tasks)
            try:
                commands = book.handle(event, now, wall)
            except Exception as exc:  # a bug, not bad input (handlers check it): refuse the one
                log.error("task_book_failed", event_type=type(event).__name__, error=repr(exc))
                if not future.done():
                    future.set_exception(exc)
                continue
            reply = self._apply(commands, records, side)
            if type(park) is _Then:
                count += 1
                reply += self._then(park.request, now, wall, records, side)
                replies.append((future, reply))
                continue
            if isinstance(event, SchedulerTick):
                self._retry = True
            if (
                park is not None
                and isinstance(event, RequestTask)
                and not reply
                and park[0] > now
                and not future.done()
            ):
                self._parked[event.worker_id] = _Parked(future, event.free_slots, park[0], park[1])
            else:
                replies.append((future, reply))
        if not bulk:
            if self._parked and self._retry:
                self._retry_parked(clock(), wall_clock(), records, replies, side)
            self._retry = False
        self._expire_parked(clock(), replies)
        self._events += count
        self._largest = max(self._largest, count)
        if records:
            await self._append(records, replies)
        for future, reply in replies:
            if not future.done():
                future.set_result(reply)
        if side:
            self._side(side)

    def _then(
        self, request: RequestTask, now: float, wall: float, records: list[Record], side: list[Command]
    ) -> list[Command]:
        """The leases a report's piggybacked request is granted (none if the book refused it)."""
        if self._parked and request.prefetch:
            request = RequestTask(request.worker_id, request.free_slots, prefetch=False)
        try:
            commands = self.book.handle(request, now, wall)
        except Exception as exc:  # a bug, as in _batch: the report stands, no lease is granted
            log.error("task_book_failed", event_type="RequestTask", error=repr(exc))
            return []
        return [c for c in self._apply(commands, records, side) if isinstance(c, Lease)]

    def _apply(self, commands: list[Command], records: list[Record], side: list[Command]) -> list[Command]:
        reply: list[Command] = []
        for command in commands:
            if isinstance(command, Record):
                records.append(command)
                entry = command.entry
                if isinstance(entry, JobSubmitted) or (
                    isinstance(entry, TaskRecord) and entry.state is TaskState.PENDING
                ):
                    self._retry = True
            elif isinstance(command, _REPLY):
                reply.append(command)
            else:
                side.append(command)
        return reply

    def _retry_parked(
        self,
        now: float,
        wall: float,
        records: list[Record],
        replies: list[tuple[asyncio.Future[list[Command]], list[Command]]],
        side: list[Command],
    ) -> None:
        fruitless: set[Hashable] = set()
        for worker_id, parked in list(self._parked.items()):
            if parked.signature in fruitless:
                continue
            if parked.future.done():
                del self._parked[worker_id]
                continue
            self._retries += 1
            reply = self._apply(
                self.book.handle(RequestTask(worker_id, parked.free_slots, prefetch=False), now, wall),
                records,
                side,
            )
            if reply:
                del self._parked[worker_id]
                replies.append((parked.future, reply))
            else:
                fruitless.add(parked.signature)

    def _expire_parked(
        self, now: float, replies: list[tuple[asyncio.Future[list[Command]], list[Command]]]
    ) -> None:
        for worker_id, parked in list(self._parked.items()):
            if parked.deadline <= now or parked.future.done():
                del self._parked[worker_id]
                replies.append((parked.future, []))

    async def _append(
        self,
        records: list[Record],
        replies: list[tuple[asyncio.Future[list[Command]], list[Command]]],
    ) -> None:
        started = time.perf_counter()
        try:
            # Rows here, the commit in a thread: the fsync releases the GIL, and the loop keeps
            # taking in messages that will form the next batch (see Journal.stage).
            if self.journal.stage(records):
                try:
                    await in_thread(self.journal.commit, what="journal_commit")
                except BaseException:
                    self.journal.rollback()  # cancelled before the commit ran: nothing was kept
                    raise
        except (JournalError, TaskError, OSError) as exc:
            fatal = (
                exc
                if isinstance(exc, JournalError)
                else JournalError(
                    f"journal {self.journal.path}: append failed: {exc}; restart the master on it"
                )
            )
            self._stop(fatal, replies)
            raise fatal from None
        self._append_s += time.perf_counter() - started
        self._batches += 1
        self._records += len(records)

    def _stop(
        self,
        fatal: JournalError,
        replies: list[tuple[asyncio.Future[list[Command]], list[Command]]],
    ) -> None:
        self._fatal = fatal
        log.error("journal_append_failed", error=str(fatal))
        futures = [f for f, _ in replies] + [f for _, f, _ in self._queue]
        futures += [p.future for p in self._parked.values()]
        futures += [f for _, f in self._exclusive]
        self._queue.clear()
        self._exclusive.clear()
        self._parked.clear()
        for future in futures:
            if not future.done():
                future.set_exception(fatal)
                # Logged once above: a caller that no longer waits (one answer waits for the
                # last of its events only) must not log it again as "never retrieved".
                future.exception()
