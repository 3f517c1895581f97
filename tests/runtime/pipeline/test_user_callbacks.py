"""The guard of ``run_pipeline``'s callbacks: the first exception a callback raises stops the run
as Ctrl-C does (its task cancelled, from the loop's thread or another), and is raised as itself
once the run stopped, not two ExceptionGroups down (report ap 3); a cancel of the caller's own
goes on as it was."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import anyio
import pytest

from troupe.runtime.pipeline.user_callbacks import UserCallbacks

HANG_GUARD_S = 30  # a bound on a hang, never on speed


def _raising(error: BaseException) -> Callable[[object], None]:
    def callback(_: object) -> None:
        raise error

    return callback


async def _stopped(callbacks: UserCallbacks, run: Callable[[], object]) -> None:
    """``run()`` then wait, as a run does, until the callback's stop ends the wait."""
    try:
        result = run()
        if asyncio.iscoroutine(result):
            await result
        await asyncio.sleep(HANG_GUARD_S)
    except asyncio.CancelledError:
        assert callbacks.error is not None
        return
    raise AssertionError("the callback's stop never came")


async def test_a_callback_that_raises_stops_the_run_and_its_error_is_raised_bare() -> None:
    callbacks = UserCallbacks()
    bug, later = ValueError("user callback bug"), KeyError("second")
    first, second = callbacks.guarded(_raising(bug)), callbacks.guarded(_raising(later))
    assert first is not None and second is not None

    def both() -> None:
        first(1)  # returns: the code that called it goes on to its next await
        second(2)  # the first error is the one raised

    await _stopped(callbacks, both)
    with pytest.raises(ValueError) as raised:
        await callbacks.raise_instead()
    assert raised.value is bug
    assert raised.value.__context__ is None  # not "while handling CancelledError"
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await callbacks.raise_instead()  # raised once
    await asyncio.sleep(0)  # and the task runs on


async def test_a_callback_called_from_a_worker_thread_stops_the_run_too() -> None:
    callbacks = UserCallbacks()
    guarded = callbacks.guarded(_raising(SystemExit(3)))
    assert guarded is not None
    await _stopped(callbacks, lambda: anyio.to_thread.run_sync(guarded, 1))
    with pytest.raises(SystemExit) as raised:
        await callbacks.raise_instead()
    assert raised.value.code == 3


async def test_a_stop_not_yet_delivered_is_taken_back_with_the_error() -> None:
    """The run ended with no await after the callback: the cancel must not end the caller's
    next await."""
    callbacks = UserCallbacks()
    guarded = callbacks.guarded(_raising(ValueError("late")))
    assert guarded is not None
    guarded(None)
    with pytest.raises(ValueError, match="late"):
        await callbacks.raise_instead()
    await asyncio.sleep(0)


async def test_a_cancel_of_the_caller_s_own_goes_on() -> None:
    callbacks = UserCallbacks()
    guarded = callbacks.guarded(_raising(ValueError("bug")))
    assert guarded is not None
    guarded(None)
    asyncio.current_task().cancel()  # type: ignore[union-attr]  # Ctrl-C, at the same moment
    with pytest.raises(asyncio.CancelledError):
        await callbacks.raise_instead()
    asyncio.current_task().uncancel()  # type: ignore[union-attr]  # the test's own, taken back


async def test_callbacks_that_return_leave_the_run_alone() -> None:
    callbacks = UserCallbacks()
    seen: list[int] = []
    guarded = callbacks.guarded(seen.append)
    assert guarded is not None and callbacks.guarded(None) is None
    guarded(7)
    await asyncio.sleep(0)
    assert seen == [7] and callbacks.error is None
    await callbacks.raise_instead()
