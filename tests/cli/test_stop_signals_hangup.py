"""A hangup (SIGHUP: the terminal went, an ssh session closed) stops a troupe command as Ctrl-C
does, and a hangup again does not turn that stop into a stop at once: as a terminal goes, the
command gets SIGHUP from its shell and again from the kernel. A Ctrl-C or SIGTERM after it still
stops at once.

The command's signal watch runs here, in this process, with its stop at once recorded instead
of done (it would end the test's process); the signals are this process's own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import anyio
import pytest

from troupe.cli.stop_signals import STOP_SIGNALS, StopSignals

WAIT_S = 30.0  # a bound on a signal's delivery, not on its speed


@pytest.fixture
def own_signal_handlers() -> Iterator[None]:
    """The handlers of this process as they were before the test (the watch leaves its own)."""
    before = {s: signal.getsignal(s) for s in (*STOP_SIGNALS, signal.SIGHUP)}
    # A hangup that no watch takes must not end the test's process: it is dropped, and the
    # test fails on the stop that never began.
    signal.signal(signal.SIGHUP, lambda _signum, _frame: None)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


@pytest.mark.usefixtures("own_signal_handlers")
def test_a_hangup_stops_gracefully_and_a_second_hangup_is_no_second_stop() -> None:
    signals = StopSignals()
    forced: list[int | None] = []
    signals.force = lambda: forced.append(signals.signum)  # type: ignore[method-assign]

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            work = anyio.CancelScope()
            await tg.start(signals.watch, work)
            os.kill(os.getpid(), signal.SIGHUP)
            with anyio.fail_after(WAIT_S):
                while not work.cancel_called:
                    await anyio.sleep(0.01)
            assert signals.exit_status == 129
            os.kill(os.getpid(), signal.SIGHUP)  # the kernel's, as the session's leader exits
            os.kill(os.getpid(), signal.SIGTERM)  # someone who wants it gone now
            with anyio.fail_after(WAIT_S):
                while not forced:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.1)  # the SIGTERM, queued after the second hangup, is taken too
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert forced == [signal.SIGHUP]  # one stop at once, the SIGTERM's, with the hangup's status
