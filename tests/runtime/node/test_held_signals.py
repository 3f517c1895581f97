"""A signal that comes while held is not lost and not early: it is delivered as the block ends
(the template's SIGTERM between a fork and the pid's answer)."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from troupe.runtime.node.held_signals import held

WITHIN_S = 30.0  # a bound on a hang, not on speed


def test_a_held_signal_waits_for_the_end_of_the_block_and_then_arrives() -> None:
    arrived = threading.Event()

    def note(_signum: int, _frame: FrameType | None) -> None:
        arrived.set()

    before = signal.signal(signal.SIGUSR1, note)
    try:
        with held(signal.SIGUSR1):
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(1000):  # bytecodes enough for Python to run a pending handler
                pass
            assert not arrived.is_set(), "the held signal was delivered inside the block"
            assert signal.SIGUSR1 in signal.sigpending()
        assert arrived.wait(WITHIN_S), "the held signal was lost"
        assert signal.SIGUSR1 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_the_mask_is_put_back_when_the_block_raises() -> None:
    try:
        with held(signal.SIGUSR2):
            raise RuntimeError("fork failed")
    except RuntimeError:
        pass
    assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
