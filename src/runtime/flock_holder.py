"""Which process holds a ``flock``, from the kernel's table of locks (``/proc/locks``).

The kernel enters a flock in its table as it grants it, with the pid of the process that took it,
in the same step: a refused taker reads who holds it at once, where a pid the holder writes into
the file after taking the lock may not be there yet. Off Linux there is no such table.
"""

from __future__ import annotations

import os

__all__ = ["flock_holder"]


def flock_holder(st: os.stat_result) -> str | None:
    """The pid that holds a flock on the file of ``st``, or None where the table says none (no
    table, no lock, or a holder outside this process's pid namespace: the table says pid 0)."""
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            for line in table:
                # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146445 0 EOF"; "1: -> FLOCK ..." waits
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == where:
                    return fields[4] if fields[4].isdigit() and fields[4] != "0" else None
    except OSError:
        pass
    return None
