"""A child process that holds something (a journal, a run's folder) until the test lets go: it
runs ``code``, which prints ``held`` once it holds and then reads stdin to its end."""

from __future__ import annotations

import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["held_in_child"]

HELD_WITHIN_S = 60.0  # a bound against a hang, not a measure


@contextmanager
def held_in_child(code: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """The child running ``code`` with ``args``, once it said ``held``; on the way out its stdin
    is closed (it lets go and exits), or it is killed where the block failed; reaped either way."""
    holder = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        ready, _, _ = select.select([holder.stdout], [], [], HELD_WITHIN_S)
        line = holder.stdout.readline() if ready else ""
        assert line == "held\n", (line, holder.poll())
        yield holder
        holder.communicate(input="", timeout=HELD_WITHIN_S)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate()
