"""Asynchronous, bounded episode storage: encoding and commits run on the writer's own threads.

The render path hands an episode over and goes on rendering; ``threads`` workers encode and
commit episodes (:func:`~troupe.actors.lerobot.episode.write_episode`) in parallel. At most
``max_pending`` episodes are held (queued or being written); a producer at that bound waits
(:meth:`AsyncWriter.submit` blocks, :meth:`AsyncWriter.submit_async` awaits), so memory is bounded
by configuration whatever the speed of the disk.

Each submission's future carries the write's outcome: True (committed), False (the task was
already committed) or the error (``CommitError`` on a failed disk write, after which nothing
of the episode is visible and the caller retries the task).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from troupe.runtime.errors import ActorStopped, ConfigError, MailboxFull
from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.output_store import OutputStore

from .episode import EpisodeConfig, EpisodeData, write_episode

__all__ = ["AsyncWriter", "WriterStats"]

log = get_logger(__name__)


@dataclass(frozen=True)
class WriterStats:
    """Counters of one :class:`AsyncWriter`.

    Attributes:
        pending: episodes accepted and not finished (queued or being written).
        written: episodes this writer committed.
        duplicates: episodes whose task was already committed (no-ops).
        failed: episodes whose write raised.
        bytes: bytes of the episodes this writer committed.
    """

    pending: int
    written: int
    duplicates: int
    failed: int
    bytes: int


class AsyncWriter:
    """Writes episodes into an OutputStore on its own threads, with backpressure.

    Args:
        store: where episodes are committed.
        max_pending: most episodes held at once (queued + being written), >= 1.
        threads: writer threads, >= 1.
        config: episode encoding, the same for the whole dataset (default EpisodeConfig()).

    Raises:
        ConfigError: ``max_pending`` or ``threads`` is below 1.
    """

    def __init__(
        self,
        store: OutputStore,
        *,
        max_pending: int = 4,
        threads: int = 2,
        config: EpisodeConfig | None = None,
    ) -> None:
        if max_pending < 1 or threads < 1:
            raise ConfigError(
                f"AsyncWriter needs max_pending >= 1 and threads >= 1 (got {max_pending}, "
                f"{threads}); raise them"
            )
        self._store = store
        self._config = config or EpisodeConfig()
        self._max_pending = max_pending
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="troupe-episode-writer")
        self._cond = threading.Condition()
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._closed = False
        self._pending = 0
        self._written = 0
        self._duplicates = 0
        self._failed = 0
        self._bytes = 0

    def submit(self, episode: EpisodeData, timeout: float | None = None) -> Future[bool]:
        """Queue an episode for writing, waiting while ``max_pending`` are already held.

        Args:
            episode: the episode.
            timeout: most seconds to wait for room; None waits as long as it takes.

        Returns:
            A future of the write's outcome (see the module docstring).

        Raises:
            MailboxFull: no room came within ``timeout``.
            ActorStopped: the writer is closed.
        """
        with self._cond:
            if not self._cond.wait_for(self._has_room, timeout):
                raise MailboxFull(
                    f"episode writer holds {self._max_pending} episodes and none finished within "
                    f"{timeout}s; storage is slower than production: add threads or max_pending"
                )
            self._reserve()
        return self._start(episode)

    async def submit_async(self, episode: EpisodeData) -> asyncio.Future[bool]:
        """Queue an episode, awaiting (without blocking the event loop) while the writer is full.

        Returns:
            An asyncio future of the write's outcome, bound to the running loop.

        Raises:
            ActorStopped: the writer is closed.
        """
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._has_room():
                    self._reserve()
                    break
                waiter: asyncio.Future[None] = loop.create_future()
                entry = (loop, waiter)
                self._async_waiters.append(entry)
            try:
                await waiter
            finally:
                with self._cond:
                    if entry in self._async_waiters:
                        self._async_waiters.remove(entry)
        return asyncio.wrap_future(self._start(episode), loop=loop)

    def statistics(self) -> WriterStats:
        """Return the writer's counters."""
        with self._cond:
            return WriterStats(self._pending, self._written, self._duplicates, self._failed, self._bytes)

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting episodes and wait for the held ones to finish.

        Args:
            timeout: most seconds to wait; None waits for all.

        Returns:
            True if every held episode finished; False if the timeout came first (episodes
            not yet started are then cancelled; their tasks are retried by whoever leased them).
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._wake_async()
            drained = self._cond.wait_for(lambda: self._pending == 0, timeout)
        self._pool.shutdown(wait=drained, cancel_futures=not drained)
        log.info("episode_writer_closed", drained=drained)
        return drained

    def _has_room(self) -> bool:
        # Called with the lock held; closing wakes waiters so they raise instead of hanging.
        if self._closed:
            raise ActorStopped("the episode writer is closed; create a new AsyncWriter")
        return self._pending < self._max_pending

    def _reserve(self) -> None:
        self._pending += 1

    def _start(self, episode: EpisodeData) -> Future[bool]:
        try:
            future = self._pool.submit(write_episode, self._store, episode, self._config)
        except RuntimeError:  # the pool shut down between reserving and starting
            self._finish()
            raise ActorStopped("the episode writer is closed; create a new AsyncWriter") from None
        future.add_done_callback(lambda f: self._done(episode.task_id, f))
        return future

    def _done(self, task_id: str, future: Future[bool]) -> None:
        # Runs on a writer thread (or the closing one); it must release the slot whatever happens,
        # or a producer waiting for room would wait forever.
        try:
            outcome, size = self._outcome(task_id, future)
            with self._cond:
                self._written += outcome == "written"
                self._duplicates += outcome == "duplicate"
                self._failed += outcome == "failed"
                self._bytes += size
        finally:
            self._finish()

    def _outcome(self, task_id: str, future: Future[bool]) -> tuple[str, int]:
        if future.cancelled():
            return "cancelled", 0
        error = future.exception()
        if error is not None:
            log.warning("episode_write_failed", task_id=task_id, error=str(error))
            return "failed", 0
        if not future.result():
            return "duplicate", 0
        try:
            path = self._store.committed_path(task_id)
            return "written", sum(p.stat().st_size for p in path.iterdir() if p.is_file())
        except OSError:
            return "written", 0  # the output is committed; only its size is unknown

    def _finish(self) -> None:
        with self._cond:
            self._pending -= 1
            self._cond.notify_all()
            self._wake_async()

    def _wake_async(self) -> None:
        # Called with the lock held, from any thread: each waiter re-checks for room itself.
        for loop, waiter in self._async_waiters:
            with contextlib.suppress(RuntimeError):  # a closed loop: its coroutine is gone too
                loop.call_soon_threadsafe(_set_done, waiter)


def _set_done(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
