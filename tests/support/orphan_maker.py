"""A test-only actor that starts a process of its own and leaves it behind, as a library's
helper process would be when its worker dies."""

from __future__ import annotations

import subprocess
import sys

from troupe.runtime.core.actor import Actor, handles

# The child waits for the test's gate file, not for a time: it exits when the test says so,
# however late a loaded machine gets there (and after MOST_S regardless, so none is left).
_WAIT_FOR_GATE = """
import os, sys, time
gate, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while not os.path.exists(gate) and time.monotonic() < deadline:
    time.sleep(0.02)
"""
MOST_S = 120.0


class OrphanMaker(Actor):
    """``spawn`` starts a Python that runs until the file ``gate`` exists and answers its pid
    (never waited for)."""

    @handles("spawn")
    def spawn(self, gate: str) -> int:
        child = subprocess.Popen(
            [sys.executable, "-c", _WAIT_FOR_GATE, str(gate), str(MOST_S)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Out of the worker's process group (a daemon's own session), which the node kills
            # when the worker dies: this one outlives it, for the node to adopt and reap.
            start_new_session=True,
        )
        return child.pid
