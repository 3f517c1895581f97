"""A test-only actor that starts a process of its own and leaves it behind, as a library's
helper process would be when its worker dies."""

from __future__ import annotations

import subprocess
import sys

from troupe.runtime.core.actor import Actor, handles


class OrphanMaker(Actor):
    """``spawn`` starts a Python that sleeps ``seconds`` and answers its pid (never waited for)."""

    @handles("spawn")
    def spawn(self, seconds: float) -> int:
        child = subprocess.Popen(
            [sys.executable, "-c", f"import time; time.sleep({float(seconds)})"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return child.pid
