"""The template's stop (SIGTERM from its node), put off while a fork is under way.

The template forks a worker and then tells its node the worker's pid: a SIGTERM between the two
ended the template with the worker made and its pid unsaid, and the worker, reparented to the
node, ran on after it (CI: a replica restarted as its run ended outlived the test). Blocking
the signal would not do: a blocked signal sent to the process goes to any thread that does
not block it, and torch starts native threads as it imports; a Python handler runs in the main
thread whichever thread the signal reached.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType

__all__ = ["DeferredStop"]


class DeferredStop:
    """SIGTERM ends this process at once (exit 0, no teardown of its imports), except inside
    :meth:`deferred`, which it leaves first. A fork made inside, before it is anything else,
    ends of the signal as a process with the default disposition would."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.busy = False
        self.asked = False

    def install(self) -> None:
        """Handle SIGTERM so from now on (in the main thread, as Python handlers are)."""
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, _signum: int, _frame: FrameType | None) -> None:
        if os.getpid() != self.pid:  # a fork that has not yet become its worker
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self.busy:
            self.asked = True
            return
        os._exit(0)  # torch's teardown alone takes seconds, and nothing here needs one

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A stretch a stop must not cut in two: a stop that comes meanwhile ends the process
        as it leaves (in this process only; a fork leaves it as itself)."""
        self.busy = True
        try:
            yield
        finally:
            self.busy = False
            if self.asked and os.getpid() == self.pid:
                os._exit(0)
