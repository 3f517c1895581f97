"""When a process started, as a number no clock adjustment moves: what tells a live process
from a later one that was given its pid.

psutil's ``create_time`` adds the boot time to the start tick, and Linux derives the boot time
from the wall clock each time it is read (``btime`` in /proc/stat): a clock step (NTP, a VM
resumed) moves the start time of every process, so a live writer's recorded start no longer
matches and it is taken for a dead one whose pid was reused. The start tick itself (field 22
of /proc/PID/stat, clock ticks since boot) never changes; elsewhere the creation time in
hundredths of a second stands in for it.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["age_s", "start_ticks"]


def start_ticks(pid: int) -> int | None:
    """The start of the live process ``pid`` in clock ticks since boot; None when there is no
    such process or it is a zombie (it has exited: only its exit status waits to be read)."""
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return None
        # The command name (field 2) may hold spaces and parentheses: count after its last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        try:
            # Field 3 is the state (Z: zombie, X: dead), field 22 the start tick.
            return None if fields[0] in (b"Z", b"X") else int(fields[19])
        except (IndexError, ValueError):
            return None
    import psutil  # off Linux only: a worker process imports this module, not psutil (~6 ms)

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return round(process.create_time() * 100)
    except psutil.Error:
        return None


def age_s() -> float | None:
    """Seconds since this process started (to a clock tick), or None where that cannot be read."""
    ticks = start_ticks(os.getpid())
    if ticks is None:
        return None
    if sys.platform.startswith("linux"):
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - ticks / 100
