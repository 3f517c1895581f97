"""Signals held back for a stretch of code that must not be cut in two.

The template forks a worker and then tells its node the worker's pid: a SIGTERM (the node's
stop) between the two ended the template with the worker made and its pid unsaid, and the
worker, reparented to the node, ran on after it (CI: a replica restarted as its run ended
outlived the test). Held, the signal is delivered as the stretch ends, once the pid is said.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

__all__ = ["held"]


@contextlib.contextmanager
def held(*signums: signal.Signals) -> Iterator[None]:
    """Block ``signums`` in this thread for the block; one that came meanwhile is delivered as
    it ends (a fork inside inherits the mask, and leaves the block the same way)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
