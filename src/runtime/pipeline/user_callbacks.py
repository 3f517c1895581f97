"""The callbacks a program gives ``run_pipeline`` (``on_progress``, ``on_start``, ``on_event``,
``on_importing``, ``on_warning``): one that raises stops the run, and its own exception is what
the caller gets.

They are called deep in the run's task groups: raised there, the exception came out of
``run_pipeline_sync`` two ExceptionGroups down (report ap 3), and raised in a stop's cleanup (a
line said while the node stops) it would cut that cleanup short. Each is called through a guard
instead, which keeps the first exception and stops the run as Ctrl-C does: it cancels the task
that called ``run_pipeline``, so that the run stops from the inside out (the replicas, the node,
the master; what the stages committed stays committed, and a rerun resumes). ``raise_instead``
takes that cancellation back and raises the exception, as itself, once the run has stopped.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from troupe.runtime.library_logging import get_logger

__all__ = ["CALLBACKS", "UserCallbacks", "callbacks_guarded"]

log = get_logger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

CALLBACKS = ("on_progress", "on_start", "on_event", "on_importing", "on_warning")
"""The keyword arguments of ``run_pipeline`` that are a program's callbacks."""


def callbacks_guarded(run: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """``run`` (``run_pipeline``) with its callback arguments (:data:`CALLBACKS`) called
    through one :class:`UserCallbacks`: the first that raises stops the run, and is raised."""

    @functools.wraps(run)
    async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        callbacks = UserCallbacks()
        for name in CALLBACKS:
            if name in kwargs:
                kwargs[name] = callbacks.guarded(kwargs[name])  # type: ignore[arg-type]
        result: R | None = None
        ran = False
        try:
            result = await run(*args, **kwargs)
            ran = True
        except asyncio.CancelledError:
            if callbacks.error is None:  # Ctrl-C, the caller's cancel: not a callback's stop
                raise
        await callbacks.raise_instead()
        assert ran, "only a callback's stop ends the run without a result"
        return result  # type: ignore[return-value]

    return guarded


class UserCallbacks:
    """The guard of one run's callbacks; made in the task that runs the run."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        task = asyncio.current_task()
        assert task is not None, "made in the task that runs the run"
        self._task = task
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def guarded(self, callback: Callable[P, None] | None) -> Callable[P, None] | None:
        """``callback`` called through the guard (None stays None): it never raises."""
        if callback is None:
            return None

        def call(*args: P.args, **kwargs: P.kwargs) -> None:
            try:
                callback(*args, **kwargs)
            except BaseException as exc:  # sys.exit() in a callback stops the run the same way
                self._failed(callback, exc)

        return call

    async def raise_instead(self) -> None:
        """Where a callback raised: take back the cancellation it made and raise its exception
        instead (the first one, its traceback kept); nothing where none raised. Called outside
        any ``except``, so that the exception is not shown as raised while handling the stop.

        Raises:
            CancelledError: the task was cancelled by another too: that stop goes on.
        """
        error, self.error = self.error, None
        if error is None:
            return
        try:
            # A cancel not delivered yet (the run ended with no await since the callback) or not
            # made yet (asked from a thread) is taken here, not at the caller's next await.
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass
        if self._task.uncancel() > 0:
            raise asyncio.CancelledError
        raise error

    def _failed(self, callback: Callable[..., None], exc: BaseException) -> None:
        if self.error is not None:  # the run stops already
            return
        self.error = exc
        log.warning(
            "run_stopped_by_callback",
            callback=getattr(callback, "__qualname__", repr(callback)),
            error=f"{type(exc).__name__}: {exc}",
        )
        reason = f"the run's {getattr(callback, '__name__', 'callback')} raised {type(exc).__name__}"
        if threading.get_ident() == self._thread:
            self._task.cancel(reason)
        else:  # a callback called from a worker thread may not touch the task itself
            self._loop.call_soon_threadsafe(self._task.cancel, reason)
