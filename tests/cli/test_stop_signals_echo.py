"""fh 4: one stop request that arrives twice is one graceful stop. GNU ``timeout`` sends its
SIGTERM to the command and then to its process group, so the command gets it twice within
microseconds; the second was taken as "stop at once" (SIGKILL of every process) whenever the
two did not merge while pending. The first signal again within ``SAME_STOP_S`` of it is now
that stop's echo; the same signal later, or another stop signal, still stops at once.

The watch runs in this process on a fake clock (the seconds between signals are the test's,
not the machine's), with its stop at once recorded instead of done; the signals are this
process's own. A signal is known to be taken when the watch has read the clock for it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import anyio
import pytest

from troupe.cli.stop_signals import SAME_STOP_S, STOP_SIGNALS, StopSignals

WAIT_S = 30.0  # a bound on a signal's delivery, not on its speed


class FakeClock:
    """Monotonic seconds the test sets; counts the reads (one per signal the watch weighs)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


@pytest.fixture
def own_signal_handlers() -> Iterator[None]:
    """The handlers of this process as they were before the test (the watch leaves its own)."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


async def _until(what: str, condition: object) -> None:
    with anyio.fail_after(WAIT_S):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.01)


@pytest.mark.usefixtures("own_signal_handlers")
def test_the_same_signal_at_once_again_is_one_stop_and_later_it_stops_at_once() -> None:
    clock = FakeClock()
    signals = StopSignals(quiet=True, clock=clock)
    forced: list[int | None] = []
    signals.force = lambda: forced.append(signals.signum)  # type: ignore[method-assign]

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            work = anyio.CancelScope()
            await tg.start(signals.watch, work)
            os.kill(os.getpid(), signal.SIGTERM)  # timeout's, to the command
            await _until("the first SIGTERM taken", lambda: work.cancel_called)
            assert clock.reads == 1 and signals.exit_status == 143
            clock.now += SAME_STOP_S / 10
            os.kill(os.getpid(), signal.SIGTERM)  # timeout's again, to the command's group
            await _until("the echo weighed", lambda: clock.reads == 2)
            assert forced == []  # one request: the graceful stop goes on
            clock.now += SAME_STOP_S  # a person (or a supervisor) who asks again, later
            os.kill(os.getpid(), signal.SIGTERM)
            await _until("the second stop taken", lambda: forced)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert forced == [signal.SIGTERM]


@pytest.mark.usefixtures("own_signal_handlers")
def test_another_stop_signal_at_once_after_the_first_still_stops_at_once() -> None:
    """Only the first signal echoes: a Ctrl-C right after a SIGTERM is a second request."""
    clock = FakeClock()
    signals = StopSignals(quiet=True, clock=clock)
    forced: list[int | None] = []
    signals.force = lambda: forced.append(signals.signum)  # type: ignore[method-assign]

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            work = anyio.CancelScope()
            await tg.start(signals.watch, work)
            os.kill(os.getpid(), signal.SIGTERM)
            await _until("the SIGTERM taken", lambda: work.cancel_called)
            os.kill(os.getpid(), signal.SIGINT)
            await _until("the Ctrl-C taken", lambda: forced)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert forced == [signal.SIGTERM]  # with the first signal's status


@pytest.mark.usefixtures("own_signal_handlers")
def test_an_echo_after_the_watch_ended_is_no_stop_at_once_either() -> None:
    """The stop was quick and the watch is over (the process winds down): its handler weighs
    the echo the same way."""
    clock = FakeClock()
    signals = StopSignals(quiet=True, clock=clock)
    forced: list[int | None] = []
    signals.force = lambda: forced.append(signals.signum)  # type: ignore[method-assign]

    async def main() -> None:
        with anyio.CancelScope() as watch:
            work = anyio.CancelScope()
            async with anyio.create_task_group() as tg:
                await tg.start(signals.watch, work)
                os.kill(os.getpid(), signal.SIGTERM)
                await _until("the SIGTERM taken", lambda: work.cancel_called)
                watch.cancel()

    anyio.run(main)
    late = signal.getsignal(signal.SIGTERM)
    assert callable(late)
    late(signal.SIGTERM, None)  # the echo, as the process winds down
    assert forced == []
    clock.now += SAME_STOP_S
    late(signal.SIGTERM, None)  # a second request
    assert forced == [signal.SIGTERM]
